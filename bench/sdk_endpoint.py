"""Cost of reaching the model through the OpenAI-compatible endpoint (rLLM's ``fn(**task)`` with the
``openai`` client) against the in-process ``ModelClient`` (``fn(task, model)``).

The same tiny model, the same seed and the same batch of episodes (``--episodes``, one call of
``--tokens`` tokens each) run through the rollout engine in three forms, alternately,
``--repeats`` times each; the median wall and CPU seconds per batch are compared, and the
difference per call is the endpoint's overhead (HTTP on loopback, JSON, a worker thread per sync
episode, the openai client). Generation itself is the same in all three.

    python bench/sdk_endpoint.py [--episodes 32] [--tokens 4] [--repeats 5]

Results: bench/results/sdk_endpoint.json (and the table printed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from training.agents.spec import AgentSpec  # noqa: E402
from training.config import Config  # noqa: E402
from training.rollouts.generation import HFBatchGenerator  # noqa: E402
from training.rollouts.episode_runner import EpisodeRunner  # noqa: E402
from training.agents.sdk import get_chat_client, get_chat_client_async  # noqa: E402
from training.rollouts.chat_endpoint import ChatEndpoint  # noqa: E402
from training.rollouts.tiny import build_char_tokenizer, build_tiny_model  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 3+4? "}]


async def in_process(task, model):
    await model.chat(MESSAGES)
    return 0.0


def sync_openai(**task):
    get_chat_client(base_url="http://localhost:4000/v1", api_key="EMPTY").chat.completions.create(
        model="m", messages=MESSAGES
    )
    return 0.0


async def async_openai(**task):
    client = get_chat_client_async(base_url="http://localhost:4000/v1", api_key="EMPTY")
    await client.chat.completions.create(model="m", messages=MESSAGES)
    await client.close()
    return 0.0


FORMS = {"fn(task, model)": in_process, "fn(**task) sync openai": sync_openai, "fn(**task) async openai": async_openai}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer)
    config = Config.build({"rllm.agent.max_tokens_per_turn": args.tokens})
    tasks = [{"i": i} for i in range(args.episodes)]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in FORMS}
    with ChatEndpoint(tokenizer=tokenizer) as endpoint:  # one per run, as the trl backend keeps it
        for repeat in range(args.repeats + 1):  # the first round warms up and is not counted
            for name, func in FORMS.items():
                engine = EpisodeRunner(AgentSpec(agent_run_func=func).validate(),
                                       HFBatchGenerator(model, tokenizer, seed=repeat), tokenizer, config,
                                       endpoint=endpoint)
                wall, cpu = time.perf_counter(), time.process_time()
                episodes = engine.run(tasks)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                errors = [e.error for e in episodes if e.error]
                if errors:
                    raise SystemExit(f"{name}: {errors[0]}")
                if repeat:
                    times[name].append((wall, cpu))
    base_wall = statistics.median(w for w, _ in times["fn(task, model)"])
    base_cpu = statistics.median(c for _, c in times["fn(task, model)"])
    rows = []
    for name, samples in times.items():
        wall = statistics.median(w for w, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        rows.append({
            "form": name, "wall_s_per_batch": round(wall, 4), "cpu_s_per_batch": round(cpu, 4),
            "wall_ms_overhead_per_call": round((wall - base_wall) / args.episodes * 1e3, 2),
            "cpu_ms_overhead_per_call": round((cpu - base_cpu) / args.episodes * 1e3, 2),
        })
    result = {
        "bench": "sdk_endpoint", "episodes": args.episodes, "tokens_per_call": args.tokens, "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "torch_threads": 1, "rows": rows,
    }
    out = ROOT / "bench" / "results" / "sdk_endpoint.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'form':28} {'wall s':>8} {'cpu s':>8} {'+wall ms/call':>14} {'+cpu ms/call':>13}")
    for row in rows:
        print(f"{row['form']:28} {row['wall_s_per_batch']:8.3f} {row['cpu_s_per_batch']:8.3f} "
              f"{row['wall_ms_overhead_per_call']:14.2f} {row['cpu_ms_overhead_per_call']:13.2f}")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
