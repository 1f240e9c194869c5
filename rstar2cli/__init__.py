"""rstar2cli.

NOTE: vLLM starts its engine core and workers with multiprocessing's spawn, which first imports the
parent's main module in each (under `rstar2`, the CLI, and this package with it). So this is the
earliest point where a vLLM worker can be made to leave a SIGTERM sent to the whole job to its
engine core (`procguard.leave_sigterm_to_the_engine_core`), and where vLLM's processes are made
to end without the interpreter's teardown (`fastexit`); in any other process both do nothing.
"""

from rstar2cli.fastexit import end_vllm_children_without_teardown as _end_without_teardown
from rstar2cli.procguard import leave_sigterm_to_the_engine_core as _leave_sigterm

__version__ = "0.1.0"

_end_without_teardown()
_leave_sigterm()
