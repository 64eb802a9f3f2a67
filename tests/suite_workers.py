"""pytest-xdist's test processes, forked from a warm process that imported the heavy libraries once.

Each of ``make test``'s four test processes imports every test module as it collects, and with them
torch, transformers, TRL, OpenAI's and MCP's clients: about 8 of its 13 CPU-seconds of collection,
paid four times on two cores before the first test runs. tests/platform_slots.py starts one warm
process of this interpreter (``training.isolation.forkserver``, the platform's own, allowed to run
only this module) and hands xdist this module as the Python of each test process:

    python -m suite_workers ADDRESS -u -c "import sys;exec(eval(sys.stdin.readline()))"

which asks the warm process to fork the test process with this process's standard streams (the
pipes xdist speaks its protocol over), environment and folder, then waits for it and ends with its
exit code. Where the warm process cannot serve (gone, or the environment differs in a variable its
libraries read when imported), this process becomes the plain Python xdist asked for.

Only libraries are imported before the fork, never the project's modules or pytest's plugins: what
the project reads from the environment as it is imported (each test process's own Redis database
and var folder, set as pytest starts in it) is read in the test process, as before.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the project (this file is run from tests/)

from training.isolation import forkserver  # noqa: E402  (stdlib only)

# Imported by the test modules as they are collected (python -X importtime, the slowest first), none
# of them a pytest plugin (pytest would warn that it cannot rewrite the plugin's asserts); transformers
# imports anyio, which is one, and that one warning is silenced in pytest.ini.
PRELOAD = (*forkserver.PRELOAD, "transformers:Qwen2ForCausalLM", "transformers:Qwen2Tokenizer",
           "transformers:PreTrainedTokenizerFast", "trl.extras.profiling", "openai", "mcp", "pandas", "peft")
WORKER = "--worker"


def main(argv: list[str]) -> None:
    if argv[:1] == [WORKER]:  # forked, run as __main__: what ``python -c <xdist's bootstrap line>`` runs, there
        exec(eval(sys.stdin.readline()), globals())  # noqa: S307 (execnet's bootstrap, as xdist's plain Python runs it)
        return
    address, plain = argv[0], argv[1:]
    try:
        child = forkserver.start(address, "suite_workers", [WORKER], dict(os.environ, PYTHONUNBUFFERED="1"), os.getcwd())
    except forkserver.NotServed as why:
        sys.stderr.write(f"suite_workers: a plain test process ({why})\n")
        os.execv(sys.executable, [sys.executable, *plain])
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the forked process leads a session of its own
        signal.signal(number, lambda number, _: os.kill(child.pid, number))
    code = child.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
