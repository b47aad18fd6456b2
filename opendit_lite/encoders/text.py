"""Frozen text encoders for captions: transformers' T5 encoder and CLIP text model, loaded from a
local folder (nothing is downloaded), and a "sharded text encoder" for inference.

``TextEncoder.encode(prompts)`` returns ``(states [B, max_length, width], mask [B, max_length])``
with captions padded/truncated to ``max_length`` tokens, the layout the video models take.

Sharded text encoder (LiteGen's ``encoder.fsdp``): T5-XXL's 4.7B parameters in bf16 take ~9.5 GB
on every rank when replicated. ``shard_text_encoder`` keeps 1/P of the parameters per rank (P =
the world, or the ranks of this node with ``encoder.group``) and all-gathers each layer's
parameters just before that layer runs, dropping them after it, so the resident parameter memory
is ~1/P plus one layer plus the embeddings. Since the gathered values are the original ones, the output is the
unsharded encoder's bit for bit. It is an inference-only scheme (the encoder is frozen): hooks
on forward, no gradient reduction.
"""

import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

TEXT_ENCODER_KINDS = ("t5", "clip")
# Kinds the diffusers families' encoders add (``family_encoders.py``): Wan's UMT5 and HunyuanVideo's Llama.
FAMILY_TEXT_KINDS = ("umt5", "llama")


class TextEncoder:
    """A frozen tokenizer + encoder pair; ``kind`` is ``"t5"``, ``"clip"``, ``"umt5"`` or ``"llama"``."""

    def __init__(self, tokenizer, model: nn.Module, max_length: int, kind: str):
        if kind not in TEXT_ENCODER_KINDS + FAMILY_TEXT_KINDS:
            raise ValueError(f"unknown text encoder kind {kind!r}; choose one of {TEXT_ENCODER_KINDS}")
        self.tokenizer = tokenizer
        self.model = model.eval().requires_grad_(False)
        self.max_length = max_length
        self.kind = kind
        # Read once: a sharded encoder holds no parameters between forwards.
        self.device = next(model.parameters()).device

    @property
    def width(self) -> int:
        return self.model.config.hidden_size if self.kind in ("clip", "llama") else self.model.config.d_model

    def tokenize(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokenizer(list(prompts), max_length=self.max_length, padding="max_length",
                                truncation=True, return_tensors="pt")
        return tokens.input_ids, tokens.attention_mask

    @torch.no_grad()
    def encode_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids [B, L] -> last hidden states [B, L, width]."""
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
        return out.last_hidden_state

    def encode(self, prompts: Sequence[str]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (states [B, max_length, width], bool mask [B, max_length], True = real token)."""
        ids, mask = self.tokenize(prompts)
        return self.encode_ids(ids, mask), mask.bool().to(self.device)


def load_text_encoder(kind: str, path: str, max_length: int, dtype: torch.dtype = torch.float32,
                      device="cpu") -> TextEncoder:
    """Load a T5 encoder (``T5EncoderModel``) or CLIP text model from a local folder holding both
    the model (``save_pretrained``) and its tokenizer."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"text encoder folder {path!r} not found: point text_encoder.path at a local "
                                f"folder with the model and tokenizer (save_pretrained output); nothing is downloaded")
    from .pipeline_folder import TOKENIZER_FILES, has_tokenizer

    if not has_tokenizer(path):  # transformers would make one from the model config alone: every word <unk>
        files = ", ".join(TOKENIZER_FILES)
        raise FileNotFoundError(f"text encoder folder {path!r} holds no tokenizer (none of {files}),"
                                f" so captions would be encoded as unknown tokens: save the tokenizer beside the model "
                                f"(a pipeline keeps it in the matching tokenizer*/ folder), or train from the whole "
                                f"pipeline with model.pipeline")
    import transformers

    model_cls = {"t5": transformers.T5EncoderModel, "clip": transformers.CLIPTextModel}.get(kind)
    if model_cls is None:
        raise ValueError(f"unknown text encoder kind {kind!r}; choose one of {TEXT_ENCODER_KINDS}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = model_cls.from_pretrained(path, torch_dtype=dtype, local_files_only=True).to(device)
    return TextEncoder(tokenizer, model, max_length, kind)


# ----------------------------------------------------------------------------------------------
# Sharded text encoder
# ----------------------------------------------------------------------------------------------

class _ShardedUnit:
    """Flat 1/P shard of the parameters of ``owners`` (modules), all-gathered around ``trigger``'s
    forward and dropped after it. A parameter tied between owners is stored once."""

    def __init__(self, owners: List[nn.Module], trigger: nn.Module, group: Optional[dist.ProcessGroup]):
        self.group = group
        self.size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        unique: Dict[int, int] = {}
        tensors: List[torch.Tensor] = []
        self.slots: List[Tuple[nn.Module, str, int]] = []    # (owner, attribute, index into tensors)
        for owner in owners:
            for name, p in list(owner.named_parameters(recurse=False)):
                if id(p) not in unique:
                    unique[id(p)] = len(tensors)
                    tensors.append(p.detach())
                self.slots.append((owner, name, unique[id(p)]))
                delattr(owner, name)                              # drop the full copy
                setattr(owner, name, None)
        self.shapes = [t.shape for t in tensors]
        flat = torch.cat([t.reshape(-1) for t in tensors])
        chunk = -(-flat.numel() // self.size)
        flat = torch.nn.functional.pad(flat, (0, chunk * self.size - flat.numel()))
        self.shard = flat[rank * chunk:(rank + 1) * chunk].clone()  # this rank's 1/P
        trigger.register_forward_pre_hook(self._gather)
        trigger.register_forward_hook(self._release)

    def _gather(self, module: nn.Module, args) -> None:
        full = self.shard.new_empty(self.shard.numel() * self.size)
        dist.all_gather_into_tensor(full, self.shard, group=self.group)
        views, offset = [], 0
        for shape in self.shapes:
            views.append(full[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()
        for owner, name, index in self.slots:
            setattr(owner, name, views[index])

    def _release(self, module: nn.Module, args, output) -> None:
        for owner, name, _ in self.slots:
            setattr(owner, name, None)


def _layer_list(model: nn.Module) -> nn.ModuleList:
    """The encoder's stack of layers: its largest ModuleList (T5 ``encoder.block``, CLIP
    ``text_model.encoder.layers``)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of layers to shard by")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def shard_text_encoder(encoder: TextEncoder, group: Optional[dist.ProcessGroup] = None) -> TextEncoder:
    """Shard the encoder's parameters over ``group`` (all ranks when None) in place.

    The unit of gathering is one encoder layer (gathered for that layer's forward only); the
    remaining parameters (embeddings, final norm), which modules read from their children before
    calling them, are one unit gathered for the whole forward. All ranks of the group must call
    ``encode`` together (the gathers are collectives), e.g. each with its own prompts.
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return encoder
    layers = _layer_list(encoder.model)
    inside = {id(m) for layer in layers for m in layer.modules()}
    units = [_ShardedUnit(list(layer.modules()), layer, group) for layer in layers]
    rest = [m for m in encoder.model.modules() if id(m) not in inside]
    units.append(_ShardedUnit(rest, encoder.model, group))
    encoder.sharded = units
    return encoder
