"""CFG-parallel sampling through a diffusers pipeline (``model.pipeline`` runs, ``sample.cfg_parallel``): the
pipeline's own ``__call__`` runs on both ranks of a pair, and each rank's transformer computes one of
guidance's two branches; the other branch's prediction comes from its twin.

The family's conditioning declares how its pipeline runs the branches (``cfg_branches``):

* ``"batched"``: one transformer call per step on 2B rows (the B prompts' and the B negative prompts',
  in either order). Each rank runs the transformer on its half of every batched argument (tensors
  and lists of 2B rows; ``branch`` 0 the first half) and one all-gather puts the 2B outputs together.
* ``"two_calls"``: two calls per step on the same latents (the prompts', then the negative prompts').
  ``branch`` 0 computes the first call, ``branch`` 1 the second. At the first call, rank 1 returns an
  output of the shape the call gives (an empty tensor, remembered from an earlier call of the same input
  shapes), rank 0 its prediction; at the second, rank 1 computes, and one all-gather hands each rank
  its twin's prediction: rank 0 returns rank 1's, rank 1 fills the output it returned at the first call
  in place. This holds because these pipelines only hold the first output (or a view of it) until the
  second returns, then combine the two. The first call of a new input shape is computed by both ranks
  (nothing to fill); its second call is split as above.

Every prediction is the one process's (the same rows through the same transformer), so the samples are
the pipeline's called directly. A call that does not follow the declared pattern (2B rows, or two calls
on the same latents per step) raises a ConfigError rather than mixing predictions up.
"""

from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..errors import ConfigError


def _latents(args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """The call's latent input: its first positional argument, else ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def _first(out: Any) -> Tuple[Any, Callable[[Any], Any]]:
    """A transformer output -> (its prediction: a tensor or a list of tensors, rebuild(prediction))."""
    if isinstance(out, tuple):
        return out[0], lambda pred: (pred, *out[1:])
    if isinstance(out, (torch.Tensor, list)):
        return out, lambda pred: pred
    if hasattr(out, "sample"):
        return out.sample, lambda pred: type(out)(sample=pred)
    raise ConfigError(f"sample.cfg_parallel: the transformer returned a {type(out).__name__}, whose prediction it "
                      f"cannot find (a tensor, a list of tensors, a tuple or an output with .sample).")


def _stacked(pred: Any) -> torch.Tensor:
    """A prediction as one tensor [rows, ...] (a list of per-sample tensors, Z-Image's, stacked)."""
    return torch.stack(list(pred)) if isinstance(pred, list) else pred


def _like(stacked: torch.Tensor, pred: Any) -> Any:
    """``stacked`` [rows, ...] in the form of ``pred`` (a list of per-sample tensors, or a tensor)."""
    return list(stacked.unbind(0)) if isinstance(pred, list) else stacked


class PipelineBranches:
    """Splits the transformer calls of a pipeline's guidance between this rank (``branch``) and its twin in
    ``group`` (module docstring). ``mode``: the family's ``cfg_branches``; ``rows``: the prompts of the
    pipeline call under way (set by ``pipeline_call``)."""

    def __init__(self, mode: str, group: Optional[dist.ProcessGroup], branch: int):
        self.mode, self.group, self.branch = mode, group, branch
        self.rows: Optional[int] = None
        self._pending: Optional[dict] = None          # the first call of a pair: its latents and output
        self._shapes: Dict[tuple, tuple] = {}         # input shapes -> (prediction's shape, dtype, form)

    # -- the exchange ----------------------------------------------------------------------------------
    def _exchange(self, mine: torch.Tensor) -> List[torch.Tensor]:
        """[this rank's prediction, ...] all-gathered over the pair: [branch 0's, branch 1's]."""
        mine = mine.contiguous()
        parts = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(parts, mine, group=self.group)
        return parts

    # -- batched: one call on 2B rows ------------------------------------------------------------------
    def _half(self, value: Any, rows: int) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == rows:
            return value[self.branch * rows // 2:(self.branch + 1) * rows // 2]
        if isinstance(value, list) and len(value) == rows:
            return value[self.branch * rows // 2:(self.branch + 1) * rows // 2]
        return value

    def _batched(self, model, args, kwargs):
        rows = len(_latents(args, kwargs))
        if rows == self.rows:  # a step without guidance (both branches' ranks compute it whole)
            return model(*args, **kwargs)
        if rows != 2 * self.rows:
            raise ConfigError(f"sample.cfg_parallel: {type(model).__name__} was called on {rows} rows for "
                              f"{self.rows} prompts, neither the prompts' rows nor both guidance branches' (2 x "
                              f"{self.rows}) its family declares (cfg_branches='batched'): its pipeline cannot be "
                              f"split; set sample.cfg_parallel=false.")
        out = model(*(self._half(a, rows) for a in args), **{k: self._half(v, rows) for k, v in kwargs.items()})
        pred, rebuild = _first(out)                                                       # [B, ...]
        return rebuild(_like(torch.cat(self._exchange(_stacked(pred))), pred))            # [2B, ...]

    # -- two calls per step on the same latents ---------------------------------------------------------
    @staticmethod
    def _signature(model, args, kwargs) -> tuple:
        shapes = [tuple(v.shape) for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        return (id(model), tuple(shapes))

    def _placeholder(self, known: tuple) -> Any:
        shape, dtype, device, is_list = known
        empty = torch.empty(shape, dtype=dtype, device=device)
        return (list(empty.unbind(0)) if is_list else empty,)

    def _two_calls(self, model, args, kwargs):
        latents = _latents(args, kwargs)
        pending = self._pending
        if pending is None:  # the first call of a step
            key = self._signature(model, args, kwargs)
            known = self._shapes.get(key)
            both = known is None or self.branch == 0
            out = model(*args, **kwargs) if both else self._placeholder(known)
            pred, _ = _first(out)
            stacked = _stacked(pred)
            if known is None:
                self._shapes[key] = (tuple(stacked.shape), stacked.dtype, stacked.device, isinstance(pred, list))
            self._pending = dict(model=model, latents=latents, out=out, computed=known is None)
            return out
        same = pending["model"] is model and (latents is pending["latents"] or (
            isinstance(latents, torch.Tensor) and latents.shape == pending["latents"].shape
            and torch.equal(latents, pending["latents"])))
        if not same:
            self._pending = None
            raise ConfigError(f"sample.cfg_parallel: {type(model).__name__} was not called twice on the same latents "
                              f"in a step, as its family declares (cfg_branches='two_calls'): its pipeline ran no "
                              f"unconditional branch at this guidance scale, or runs its branches otherwise. Set "
                              f"sample.cfg_parallel=false.")
        self._pending = None
        first, _ = _first(pending["out"])
        if self.branch == 1:
            out = model(*args, **kwargs)
            pred, _ = _first(out)
            theirs = self._exchange(_stacked(pred))[0]
            if not pending["computed"]:  # fill the output returned at the first call, in place
                for dst, src in zip(first if isinstance(first, list) else [first],
                                    theirs.unbind(0) if isinstance(first, list) else [theirs]):
                    dst.copy_(src)
            return out
        theirs = self._exchange(_stacked(first))[1]
        _, rebuild = _first(pending["out"])
        return rebuild(_like(theirs, first))

    def __call__(self, model, args, kwargs):
        if self.mode == "batched":
            return self._batched(model, args, kwargs)
        return self._two_calls(model, args, kwargs)

    def finish(self) -> None:
        """After a pipeline call: the last step's pair is complete."""
        if self._pending is not None:
            self._pending = None
            raise ConfigError("sample.cfg_parallel: the pipeline's last step called its transformer once, where "
                              "its family declares two calls a step (cfg_branches='two_calls'): set "
                              "sample.cfg_parallel=false.")


class _Transformer:
    """A pipeline's transformer whose calls go through ``branches``; everything else is the model's."""

    def __init__(self, model, branches: PipelineBranches):
        self.__dict__.update(_model=model, _branches=branches)

    def __call__(self, *args, **kwargs):
        return self._branches(self._model, args, kwargs)

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)


@contextmanager
def split_branches(pipe, names: Sequence[str], branches: Optional[PipelineBranches], rows: int) -> Iterator[None]:
    """Within the block, ``pipe``'s transformers ``names`` (those it has) run through ``branches`` (None: as
    they are) for a call on ``rows`` prompts; the pipeline's own attributes are restored after (set
    directly: a pipeline's ``__setattr__`` would record the wrapper in its config)."""
    if branches is None:
        yield
        return
    held = {name: pipe.__dict__[name] for name in names if pipe.__dict__.get(name) is not None}
    branches.rows = rows
    try:
        for name, model in held.items():
            pipe.__dict__[name] = _Transformer(model, branches)
        yield
        branches.finish()
    finally:
        pipe.__dict__.update(held)
