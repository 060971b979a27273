"""Speed of the whole `asp schedule` command against reading its inputs (issue 14's target).

    python benchmarks/bench_schedule_command.py [--n 1000000] [--dir DIR] [--reference-loader] [--words]

Writes (once, seeded, cached in DIR) N prompts as JSONL (id, prompt of ~40 words, answer), a
one-epoch length history as parquet (N x G rows: prompt_id, epoch, sample, response_length,
prompt_length; heavy-tailed lengths) and the "model" whose tokenizer counts the prompts: a
byte-level BPE (GPT-2's pre-tokenizer, 4,096 tokens) trained with the ``tokenizers`` library on
the first 20,000 prompts, saved as an HF tokenizer directory (``model.path``). Then, each in a
fresh Python process:

- ``read``: read the same two files with pyarrow's readers (JSON lines, parquet) and argsort
  the history's response lengths: the floor any tool that reads these files pays;
- ``asp schedule``: the command as a user runs it (G = 8, 64 instances, one epoch), interpreter
  start, imports, loading, planning, the analytic estimates of the report and writing included;
  loading includes counting the prompts in tokens of ``model.path`` (importing transformers,
  loading the tokenizer, batch-encoding every prompt), as every plan of a prompts file does, with
  an empty token-count cache (a fresh ``XDG_CACHE_HOME``): the first plan of a file;
- ``asp schedule`` again with the counts that first run kept (a re-plan of the same file: the cache is
  keyed by the tokenizer's files, so it neither imports transformers nor loads the tokenizer);
- ``count``: the counting alone (the same call, data/prompt_tokens.py, empty cache), for the breakdown;

in the order read, schedule, read, and prints the ratios schedule / mean(read) (target <= 6).
``--words`` also times the command with ``data.prompt_length=words`` (the opt-in that counts
whitespace words with numpy, no tokenizer).
``--reference-loader`` also times the command with the line-by-line prompt loader
(``data/datasets.load_prompts``) that the fast reader falls back to. Figures, not asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READ = """
import sys, time, numpy as np, pyarrow.json as pj, pyarrow.parquet as pq
t = time.perf_counter()
prompts = pj.read_json(sys.argv[1])
hist = pq.read_table(sys.argv[2])
order = np.argsort(hist.column("response_length").to_numpy())
print(time.perf_counter() - t)
"""
FORCE_REFERENCE = """
import sys, runpy
import asp_ascend.data.prompt_index as pi
pi._jsonl_columns = lambda *a: None
sys.argv = ["asp"] + sys.argv[1:]
runpy.run_module("asp_ascend", run_name="__main__")
"""


COUNT = """
import sys, time
t = time.perf_counter()
import pyarrow.json as pj
from asp_ascend.config import load_config
from asp_ascend.integrations.prompt_tokens import counter_for
cfg = load_config(sys.argv[1], [])
count = counter_for(cfg)
count.record   # loads the tokenizer (counter_for leaves that to the first count that misses the cache)
t1 = time.perf_counter()
lengths = count(pj.read_json(cfg.data.path).column("prompt").to_pylist())
print(t1 - t, time.perf_counter() - t1, lengths.mean())
"""


def write_tokenizer(d: Path, prompts: Path) -> Path:
    """A byte-level BPE tokenizer directory trained on the first 20,000 prompts (cached in d)."""
    out = d / "tokenizer"
    if (out / "tokenizer.json").is_file():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = []
    with open(prompts) as f:
        for line, _ in zip(f, range(20000)):
            texts.append(json.loads(line)["prompt"])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "eos_token": "<|endoftext|>", "model_max_length": 1 << 20}))
    (out / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return out


def write_inputs(d: Path, n: int, G: int = 8, seed: int = 0) -> tuple[Path, Path]:
    import numpy as np
    import pandas as pd

    prompts, hist = d / f"prompts_{n}.jsonl", d / f"history_{n}.parquet"
    if prompts.exists() and hist.exists():
        return prompts, hist
    rng = np.random.default_rng(seed)
    words = np.array("the of a to and in is what find let compute number sum prove if then how many value".split())
    pool = rng.choice(words, 6000)
    plen = np.clip(rng.lognormal(np.log(40), 0.5, n), 1, 1000).astype(np.int64)
    start = rng.integers(0, 5000, n)
    ids = np.array([f"q{i:07d}" for i in range(n)], dtype=object)
    tmp = prompts.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": ids[i], "prompt": " ".join(pool[start[i]:start[i] + plen[i]]),
                                "answer": str(i % 97)}) + "\n")
    os.replace(tmp, prompts)
    body = rng.lognormal(np.log(600), 0.6, n)
    tail = 1500 * (1 - rng.random(n)) ** (-1 / 1.5)
    mean = np.minimum(np.where(rng.random(n) < 0.1, tail, body), 8192)
    resp = np.clip(mean[:, None] * rng.lognormal(-0.08, 0.4, (n, G)), 1, 8192).astype(np.int64)
    pd.DataFrame({"prompt_id": np.repeat(ids, G), "epoch": 0, "sample": np.tile(np.arange(G), n),
                  "response_length": resp.ravel(), "prompt_length": np.repeat(plen, G)}
                 ).to_parquet(hist.with_suffix(".tmp"))
    os.replace(hist.with_suffix(".tmp"), hist)
    return prompts, hist


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - t, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dir", default=str(Path(tempfile.gettempdir()) / "asp_bench_schedule"))
    ap.add_argument("--reference-loader", action="store_true")
    ap.add_argument("--words", action="store_true")
    a = ap.parse_args()
    d = Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    prompts, hist = write_inputs(d, a.n)
    model = write_tokenizer(d, prompts)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    py = sys.executable
    cfg = d / "schedule.yaml"
    cfg.write_text(f"output_dir: {d / 'out'}\ndata: {{path: {prompts}}}\nmodel: {{path: {model}}}\n"
                   f"lengths: {{path: {hist}, max_response_length: 8192}}\n"
                   "rollout: {num_instances: 64, max_num_seqs: 256}\n"
                   "train: {group_size: 8, global_batch_size: 1024, mini_batch_size: 256, epochs: 1}\n")
    sched = [str(cfg)]
    print(f"inputs: {prompts.name} ({prompts.stat().st_size / 2**20:.0f} MiB), {hist.name} "
          f"({hist.stat().st_size / 2**20:.0f} MiB); G = 8, 64 instances, global batch 1024, one epoch; "
          f"prompts counted in tokens of {model}")
    r1, _ = timed([py, "-c", READ, str(prompts), str(hist)], env)
    cache = Path(tempfile.mkdtemp(prefix="asp-bench-cache-"))
    cold = {**env, "XDG_CACHE_HOME": str(cache / "schedule")}
    s, out = timed([py, "-m", "asp_ascend", "schedule", *sched], cold)
    r2, _ = timed([py, "-c", READ, str(prompts), str(hist)], env)
    read = (r1 + r2) / 2
    planned = next((ln for ln in out.splitlines() if "planned in" in ln), "")
    print(f"read both files + argsort (pyarrow, fresh process): {r1:.2f} s, {r2:.2f} s")
    print(f"asp schedule (whole command, fresh process):       {s:.2f} s   [{planned.split('(')[-1].rstrip(')')}]")
    print(f"ratio asp schedule / read: {s / read:.2f}  (target <= 6; tokenizing the prompts included)")
    s_warm, out_w = timed([py, "-m", "asp_ascend", "schedule", *sched], cold)
    planned = next((ln for ln in out_w.splitlines() if "planned in" in ln), "")
    print(f"asp schedule again, token counts kept by the first:  {s_warm:.2f} s   [{planned.split('(')[-1].rstrip(')')}]"
          f"  ratio {s_warm / read:.2f}")
    c, out_c = timed([py, "-c", COUNT, str(cfg)], {**env, "XDG_CACHE_HOME": str(cache / "count")})
    load_s, count_s, mean_tokens = map(float, out_c.split())
    print(f"of which counting the prompts' tokens (fresh process {c:.2f} s): import transformers + load the tokenizer "
          f"{load_s:.2f} s, encode {a.n} prompts {count_s:.2f} s (mean {mean_tokens:.1f} tokens)")
    if a.words:
        s_w, _ = timed([py, "-m", "asp_ascend", "schedule", *sched, "data.prompt_length=words"], env)
        print(f"asp schedule with data.prompt_length=words (no tokenizer): {s_w:.2f} s  ratio {s_w / read:.2f}")
    if a.reference_loader:
        s_ref, _ = timed([py, "-c", FORCE_REFERENCE, "schedule", *sched], {**env, "XDG_CACHE_HOME": str(cache / "ref")})
        print(f"asp schedule with the line-by-line prompt loader:   {s_ref:.2f} s  ratio {s_ref / read:.2f}")
    import shutil

    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
