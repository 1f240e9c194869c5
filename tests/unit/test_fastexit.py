"""fastexit: vLLM's engine-core and worker processes skip the interpreter's teardown, keep their
exit status and their buffered output; other processes end as before.

A real script whose main module imports rstar2cli (as `rstar2` does) spawns three processes under
vLLM's names and one other. Each keeps an object in a module global whose `__del__` writes to
stderr: it runs in the interpreter's teardown, so it shows whether the teardown ran.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

SCRIPT = textwrap.dedent(
    """
    import multiprocessing
    import os
    import sys

    import rstar2cli  # noqa: F401


    class TornDown:
        def __init__(self, name):
            self.name = name

        def __del__(self, write=os.write):
            write(2, f"torn down {self.name}\\n".encode())


    def target(name, code):
        global kept
        kept = TornDown(name)
        print(f"ran {name}", end="")  # buffered: stdout is a pipe
        sys.exit(code)


    if __name__ == "__main__":
        spawn = multiprocessing.get_context("spawn")
        for name, code in [("EngineCore", 0), ("EngineCore_DP1", 0), ("VllmWorker-0", 3),
                           ("Trainer", 0)]:
            proc = spawn.Process(target=target, args=(name, code), name=name)
            proc.start()
            proc.join()
            print(f" {name} exit {proc.exitcode}", flush=True)
    """
)


def test_vllm_children_skip_teardown_and_keep_status_and_output(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out, err = done.stdout, done.stderr
    for name, code in [("EngineCore", 0), ("EngineCore_DP1", 0), ("VllmWorker-0", 3)]:
        assert f"ran {name} {name} exit {code}" in out, out  # the output flushed, the status kept
        assert f"torn down {name}\n" not in err, err
    assert "ran Trainer Trainer exit 0" in out, out
    assert "torn down Trainer\n" in err, err  # any other process still tears down
