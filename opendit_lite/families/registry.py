"""The one registry of the diffusers families: one ``Family`` record per family, built and
registered by its folder (``opendit_lite/families/<family>/__init__.py``), holding every piece
specific to it:

* ``block_lists`` and ``lora_targets``: the capabilities a diffusers class cannot declare itself
  (``models.capabilities``): its block lists in the order the forward runs them (the unit of
  activation checkpointing, offload and per-block compile; diffusers' own ``_repeated_blocks`` names
  classes, HunyuanVideo's include the patch embedding and the token refiner, and SD3 has none) and
  the linear layers LoRA adapts by default (``lora_targets.py``);
* ``adapter`` (``<family>/adapter.py``): the training recipe and the forward inputs from a clip batch;
* ``sp_spec`` (``<family>/sp_spec.py``): where sequence parallelism splits and gathers the image
  tokens and what each attention module attends over;
* ``fused_norms`` (``<family>/fused_norms.py``): the block swaps of the ``fused_adaln`` conversion
  and what it leaves, and why;
* ``encoding`` (``<family>/encoding.py``): the family's VAE, latent normalisation and text encoder,
  for extracting latents (``scripts/extract_latents.py --family``);
* ``step_cache`` (``<family>/step_cache.py``): what sampling's step caches need beyond diffusers'
  hooks (TeaCache's signal, the first block's timestep-modulated input, or why there is none);
* ``pipeline``: the family's diffusers pipeline class (``FluxPipeline``), the one statement of it: a
  pipeline folder of that class trains this family (``family_of_pipeline``), and a trained model
  goes back to it (its LoRA adapters through that class's own ``save_lora_weights``,
  ``interop.export_lora``, which ``<pipeline>.load_lora_weights`` reads);
* ``conditioning`` (``<family>/conditioning.py``): what that pipeline feeds its transformer, which a
  run from a pipeline folder (``model.pipeline``) trains on;
* ``variants``: the family's other pipelines that run the same transformer class with other inputs
  (image-to-video, edit: ``WanImageToVideoPipeline``, ``FluxKontextPipeline``), each a
  ``PipelineVariant`` of its pipeline class and its conditioning (``<family>/conditioning_<variant>.py``);
  a folder of a variant's class trains with the variant's conditioning (``conditioning_of_pipeline``);
* ``tiny`` (``<family>/tiny.py``): tiny random pipelines of the family's released layouts
  (``tiny_pipelines.py``, ``scripts/make_tiny_pipeline.py``).
* ``original_lora`` (``<family>/original_lora.py``, optional): the names its LoRA adapters take in the
  family's original checkpoint layout (ComfyUI's), for ``export.lora_format: comfyui`` and for
  ``lora.init_from`` reading such a file (``interop.comfyui_lora``); None: no such layout.
* ``releases`` (in the record): the transformer configs of released checkpoints, so that the planner
  (``python -m opendit_lite.plan``) plans a config naming one whose folder is not on this machine.

``register_family`` checks the record (its pieces name the same class and family), then fans the
pieces out to the mechanisms that look them up by class in their own tables, below this package in
the layers: ``models.capabilities.declare_capabilities``, ``parallel.register_family_spec`` and
``converter.diffusers_family_blocks.register_fused_norms``. A duplicate name, alias or class is an
error. ``unregistered_pieces`` says which pieces a mechanism does not hold (tests check it is empty).

Lookups: ``find_family`` (short name, alias or class name; a ConfigError naming the choices),
``family_of`` (a model or class, None when not a family), ``family_adapter`` and ``is_family`` (by
diffusers class name, as a config's ``model.name`` gives it, or a model).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch.nn as nn

from ..converter.diffusers_family_blocks import FusedNorms, fused_norms_registered, register_fused_norms
from ..encoders.family_encoders import FamilyEncoders
from ..errors import ConfigError
from ..models.capabilities import declare_capabilities, declared_capabilities
from ..parallel.diffusers_sp import FAMILIES as SP_SPECS
from ..parallel.diffusers_sp import register_family_spec
from ..parallel.diffusers_sp.spec_types import FamilySpec
from .adapter_base import FamilyAdapter
from .conditioning_base import PipelineConditioning
from .original_lora_spec import OriginalLoRA
from .step_cache_spec import StepCacheSpec
from .tiny_parts import TinyPipeline


@dataclass(frozen=True)
class Release:
    """A released checkpoint of a family: its repository and the constructor arguments in its
    ``transformer/config.json`` (the architecture's numbers; no weights)."""

    repo: str                                   # "Wan-AI/Wan2.1-T2V-14B-Diffusers"
    config: dict = field(hash=False)            # transformer/config.json, without its "_class_name" keys
    pipeline: str = ""                          # its model_index.json's pipeline class when not the family's
    experts: int = 1                            # transformers of this config (Wan 2.2 A14B: 2, transformer_2/)

    @property
    def name(self) -> str:
        """The repository's name: the folder ``huggingface-cli download`` or ``git clone`` writes."""
        return self.repo.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class PipelineVariant:
    """Another pipeline of a family's transformer class (image-to-video, edit, ...): what a folder of
    that pipeline class trains on and samples with."""

    pipeline: str                        # the diffusers pipeline class ("WanImageToVideoPipeline")
    conditioning: PipelineConditioning   # what that pipeline feeds the transformer


@dataclass(frozen=True)
class Family:
    """One diffusers family: everything specific to it (see the module docstring)."""

    name: str                          # its folder under opendit_lite/families/ ("wan", "hunyuan_video")
    class_name: str                    # the diffusers transformer class (``model.name`` in a config)
    pipeline: str                      # the diffusers pipeline class: its conditioning, LoRA files and folders
    module: str                        # the diffusers module defining that class
    block_lists: Tuple[str, ...]       # capability: the block lists, in forward order
    lora_targets: Tuple[str, ...]      # capability: the layers LoRA adapts by default
    adapter: FamilyAdapter             # training recipe and forward inputs
    sp_spec: FamilySpec                # sequence parallelism
    fused_norms: FusedNorms            # fused_adaln's block swaps
    encoding: FamilyEncoders           # VAE, latent normalisation, text encoder
    step_cache: StepCacheSpec          # sampling's step caches: TeaCache's signal
    conditioning: PipelineConditioning  # what its diffusers pipeline feeds the transformer
    tiny: Tuple[TinyPipeline, ...]     # tiny random pipelines of its released layouts
    aliases: Tuple[str, ...] = ()      # other short names ``find_family`` takes
    releases: Tuple[Release, ...] = ()  # released checkpoints' transformer configs (for the planner)
    variants: Tuple[PipelineVariant, ...] = ()  # its other pipelines (image-to-video, edit)
    # capability: the names of parameters nothing the model returns depends on (frozen for training)
    unused_parameters: Optional[Callable[[nn.Module], Sequence[str]]] = None
    original_lora: Optional[OriginalLoRA] = None  # its original checkpoint's LoRA names; None: no such layout

    @property
    def class_path(self) -> str:
        """"module.ClassName", as ``declare_capabilities`` names the class."""
        return f"{self.module}.{self.class_name}"

    @property
    def pipelines(self) -> Tuple[PipelineVariant, ...]:
        """Every pipeline class the family trains: its own (``pipeline``) first, then its variants."""
        return (PipelineVariant(self.pipeline, self.conditioning),) + tuple(self.variants)

    def conditioning_of(self, pipeline_class: str) -> PipelineConditioning:
        """The conditioning of one of the family's pipeline classes (a KeyError for another)."""
        for variant in self.pipelines:
            if variant.pipeline == pipeline_class:
                return variant.conditioning
        raise KeyError(f"the {self.name} family trains no {pipeline_class}; its pipelines: "
                       f"{', '.join(v.pipeline for v in self.pipelines)}")


FAMILIES: Dict[str, Family] = {}


def _check_record(family: Family) -> None:
    """A ValueError when the record's pieces disagree on the class or the family, or clash with one registered."""
    problems = []
    if family.adapter.class_name != family.class_name:
        problems.append(f"adapter is for {family.adapter.class_name!r}")
    if family.sp_spec.cls_name != family.class_name or family.sp_spec.family != family.name:
        problems.append(f"sp_spec is for {family.sp_spec.cls_name!r} ({family.sp_spec.family!r})")
    if family.encoding.transformer != family.class_name:
        problems.append(f"encoding is for {family.encoding.transformer!r}")
    if family.encoding.image_only != family.adapter.image_only:
        problems.append(f"encoding.image_only={family.encoding.image_only} but adapter.image_only="
                        f"{family.adapter.image_only}")
    if family.step_cache.family != family.name:
        problems.append(f"step_cache is for {family.step_cache.family!r}")
    if family.step_cache.teacache_signal is None and not family.step_cache.no_teacache:
        problems.append("step_cache has no TeaCache signal and says no reason (no_teacache)")
    if not family.block_lists or not family.lora_targets:
        problems.append("block_lists and lora_targets must be non-empty")
    if not family.pipeline or not family.tiny:
        problems.append("pipeline and tiny must be non-empty")
    classes = [v.pipeline for v in family.pipelines]
    if len(set(classes)) != len(classes):
        problems.append(f"a pipeline class is listed twice: {classes}")
    if problems:
        raise ValueError(f"family {family.name!r} ({family.class_name}): " + "; ".join(problems))
    for other in FAMILIES.values():
        names = {other.name, other.class_name, *other.aliases}
        clash = names & {family.name, family.class_name, *family.aliases}
        clash |= {v.pipeline for v in other.pipelines} & {v.pipeline for v in family.pipelines}
        if clash:
            raise ValueError(f"family {family.name!r}: {sorted(clash)} already registered by family {other.name!r}")


def register_family(family: Family) -> Family:
    """Register ``family`` and its pieces with their mechanisms (see the module docstring); returns it."""
    _check_record(family)
    declare_capabilities(family.class_path, block_lists=tuple(family.block_lists),
                         lora_targets=tuple(family.lora_targets))
    if family.unused_parameters is not None:
        declare_capabilities(family.class_path, unused_parameters=family.unused_parameters)
    register_family_spec(family.sp_spec)
    register_fused_norms(family.module, family.class_name, family.fused_norms)
    FAMILIES[family.name] = family
    return family


def unregistered_pieces(family: Family) -> List[str]:
    """The pieces of ``family`` that the registry or a mechanism does not hold as given (empty: fully registered)."""
    missing = []
    if FAMILIES.get(family.name) is not family:
        missing.append("the family registry")
    declared = declared_capabilities(family.class_path)
    if declared.get("block_lists") != tuple(family.block_lists) or declared.get("lora_targets") != tuple(
            family.lora_targets):
        missing.append("capabilities (models.capabilities.declare_capabilities)")
    if SP_SPECS.get(family.class_name) is not family.sp_spec:
        missing.append("sequence-parallel spec (parallel.register_family_spec)")
    if not fused_norms_registered(family.module, family.class_name, family.fused_norms):
        missing.append("fused norms (converter.diffusers_family_blocks.register_fused_norms)")
    return missing


def _class_name(name_or_model: Union[str, nn.Module, type, None]) -> Optional[str]:
    if name_or_model is None or isinstance(name_or_model, str):
        return name_or_model
    cls = name_or_model if isinstance(name_or_model, type) else type(name_or_model)
    return cls.__name__


def family_of_pipeline(pipeline_class: str) -> Optional[Family]:
    """The family one of whose pipelines (its own or a variant) is ``pipeline_class``; None if none."""
    return next((f for f in FAMILIES.values() if any(v.pipeline == pipeline_class for v in f.pipelines)), None)


def conditioning_of_pipeline(pipeline_class: str) -> Optional[PipelineConditioning]:
    """What the pipeline class ``pipeline_class`` feeds its family's transformer; None if no family trains it."""
    family = family_of_pipeline(pipeline_class)
    return None if family is None else family.conditioning_of(pipeline_class)


def _by_class(class_name: Optional[str]) -> Optional[Family]:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)


def family_class_names() -> Tuple[str, ...]:
    """The registered families' diffusers class names, sorted."""
    return tuple(sorted(f.class_name for f in FAMILIES.values()))


def is_family(name_or_model: Union[str, nn.Module, type, None]) -> bool:
    """True for a registered diffusers class name, or a model (or class) of one."""
    return _by_class(_class_name(name_or_model)) is not None


def family_of(name_or_model: Union[str, nn.Module, type, None]) -> Optional[Family]:
    """The family of a diffusers class name, or of a model (or class) of that class; None if none."""
    return _by_class(_class_name(name_or_model))


def family_adapter(name_or_model: Union[str, nn.Module, type]) -> FamilyAdapter:
    """The adapter of a diffusers class name, or of a model (or class) of that class."""
    family = family_of(name_or_model)
    if family is None:
        raise KeyError(f"no family adapter for {_class_name(name_or_model)!r}; registered: "
                       f"{', '.join(family_class_names())}")
    return family.adapter


def find_family(name: str) -> Family:
    """The family of a short name (``wan``), an alias or a diffusers class name; a ConfigError naming
    the choices otherwise."""
    key = name.lower()
    for family in FAMILIES.values():
        if key == family.name or key in family.aliases or name == family.class_name:
            return family
    raise ConfigError(f"unknown family {name!r}; choose one of {', '.join(FAMILIES)} (or a transformer class: "
                      f"{', '.join(f.class_name for f in FAMILIES.values())}).")
