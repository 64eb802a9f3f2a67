"""The ``code`` reward runs model-written programs against test cases (training/rewards/builtin.py,
``code_reward_fn``) in the python tool's sandbox (training/isolation/sandbox.py). Attacks a response could
carry, replayed through the reward as a training run would score them: each would pass its test
if it worked, so a reward of 1 would mean the sandbox let it through."""

from __future__ import annotations

import socket

import pytest

from training.rewards import code_reward_fn
from training.isolation.sandbox import Limits

FAST = Limits(timeout_s=10, memory_mb=512)


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.mark.parametrize("module", ["socket", "_socket"])  # _socket: the C module, the kernel's to refuse either way
def test_a_program_cannot_reach_the_network(module):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)  # the kernel queues a completed connection for accept() to find afterwards
    port = listener.getsockname()[1]
    task = {"data_source": "taco", "ground_truth": {"inputs": [""], "outputs": ["connected"]}}
    code = f"import {module}\ns = {module}.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
    scored = code_reward_fn(task, fenced(code), FAST)
    try:
        connection, _ = listener.accept()
        connection.close()
        connected = True
    except BlockingIOError:  # nothing reached the listener
        connected = False
    listener.close()
    assert not connected
    assert scored.reward == 0.0
    error = scored.metadata["test_results"][0]["error"]
    assert error.startswith("exit status 1") and ("PermissionError" in error or "OSError" in error), error


@pytest.mark.parametrize("data_source", ["taco", "livecodebench"])  # a program on stdin, a called function
def test_a_program_cannot_read_a_file_outside_its_folder(tmp_path, data_source):
    secret = tmp_path / "worker-secret.txt"
    secret.write_text("hunter2")  # readable by the worker's user, so by an unsandboxed program
    if data_source == "taco":
        task = {"data_source": "taco", "ground_truth": {"inputs": [""], "outputs": ["hunter2"]}}
        code = f"print(open({str(secret)!r}).read())"
    else:
        task = {"data_source": "livecodebench", "ground_truth": [
            {"input": "", "output": '"hunter2"', "testtype": "functional", "metadata": {"func_name": "leak"}}]}
        code = f"class Solution:\n    def leak(self):\n        return open({str(secret)!r}).read()"
    scored = code_reward_fn(task, fenced(code), FAST)
    assert scored.reward == 0.0
    result = scored.metadata["test_results"][0]
    assert "hunter2" not in result["output"]
    assert "FileNotFoundError" in result["error"], result  # not in the jail's mount namespace at all
