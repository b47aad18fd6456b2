"""torchrun that ends as the scripts do: ``python -m opendit_lite.launch`` takes torchrun's options
and command unchanged and runs ``torch.distributed.run``.

    python -m opendit_lite.launch --standalone --nproc_per_node 8 train.py --config configs/dit_xl2_256.yaml
    python -m opendit_lite.launch --nnodes 4 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint $HEAD_NODE:29500 train.py --config configs/dit_xl2_256.yaml

What differs from ``torchrun`` is how it ends:

- a Ctrl-C or SIGTERM sent to the launcher: torchrun passes it on to every rank (each saves a
  checkpoint and exits with 130) and waits for them (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds, 30
  by default), then raises its own ``SignalException``: a traceback and exit code 1. Here the
  launcher ends with one line and exit code 130, as the ranks did.
- ranks that failed: torchrun prints a traceback, then its summary of the failed ranks (each one's
  exit code and, for these scripts, its one-paragraph error) and exits with 1. Here the summary
  alone, and the ranks' own exit code when they agree (2: bad input, 3: non-finite loss, 130:
  interrupted), else 1.
"""

import sys
from typing import Optional, Sequence

from .utils.exit_codes import exit_at_once_on_stop_signals

if __name__ == "__main__":
    exit_at_once_on_stop_signals()  # a Ctrl-C or SIGTERM before torchrun starts the ranks: exit 130 at once

from .errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NON_FINITE  # noqa: E402

# Exit codes the scripts end with on purpose, which the launcher passes on when every failed rank agrees.
_SCRIPT_CODES = (EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_INTERRUPTED)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run torchrun with ``argv`` (default: the command line); returns the exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        torchrun.run(args)
    except SignalException as e:
        print(f"stopped: the launcher got {e.sigval.name} and passed it on to every rank (rank 0's line above says "
              f"where the run stopped).", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr, flush=True)  # one block per failed rank: exit code, paragraph
        codes = {failure.exitcode for failure in e.failures.values()}
        return codes.pop() if len(codes) == 1 and codes <= set(_SCRIPT_CODES) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
