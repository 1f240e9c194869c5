"""rstar2cli.

NOTE: vLLM starts its engine core and workers with multiprocessing's spawn, which first imports the
parent's main module in each (under `rstar2`, the CLI, and this package with it). So this is the
earliest point where a vLLM worker can be made to leave a SIGTERM sent to the whole job to its
engine core (`procguard.leave_sigterm_to_the_engine_core`); in any other process it does nothing.
"""

from rstar2cli.procguard import leave_sigterm_to_the_engine_core as _leave_sigterm

__version__ = "0.1.0"

_leave_sigterm()
