"""benchmarks/bench_tail.py sweep: its cost cells (custom_costs reproduces the model class's costs,
so "planned" cells change only what they scale) and its cells per workload."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_tail  # noqa: E402
import tail_common  # noqa: E402
import tail_sweep  # noqa: E402

from asp_ascend.lengths.workloads import workload_from_config  # noqa: E402
from asp_ascend.sim.run import costs_for, system_for  # noqa: E402


def _costs(cfg):
    return costs_for(cfg, system_for(cfg, "asp"))


def test_custom_costs_reproduce_the_model_class():
    base = tail_common._cfg("bimodal", None, 512, 32, {})
    same = tail_common._cfg("bimodal", None, 512, 32, tail_sweep.custom_costs(base))
    a, b = _costs(base), _costs(same)
    assert same.sim.model_class == "custom"
    assert b.instance.decode_a == pytest.approx(a.instance.decode_a)
    assert b.instance.decode_b == pytest.approx(a.instance.decode_b)
    assert b.instance.decode_c == pytest.approx(a.instance.decode_c)
    assert b.train_per_token == pytest.approx(a.train_per_token)
    assert (b.train_per_step, b.sync_s, b.kv_capacity) == (a.train_per_step, a.sync_s, a.kv_capacity)
    w = workload_from_config(base)
    t = [tail_common._run(c, w, "asp")["iteration_time_mean"] for c in (base, same)]
    assert t[1] == pytest.approx(t[0])


def test_custom_costs_scale_what_they_name():
    base = tail_common._cfg("bimodal", None, 512, 32, {})
    a = _costs(base)
    x = _costs(tail_common._cfg("bimodal", None, 512, 32, tail_sweep.custom_costs(base, (10.0, 1.0, 0.1), 4.0)))
    assert x.instance.decode_a == pytest.approx(10 * a.instance.decode_a)
    assert x.instance.decode_b == pytest.approx(a.instance.decode_b)
    assert x.instance.decode_c == pytest.approx(0.1 * a.instance.decode_c)
    assert x.train_per_token == pytest.approx(4 * a.train_per_token)


def test_cells_per_workload():
    syn = tail_sweep.sweep_cells("bimodal", None, 512, 32)
    trace = tail_sweep.sweep_cells("azure_code_x8", Path("data"), 512, 32)
    for cells in (syn, trace):
        labels = [c[0] for c in cells]
        assert len(set(labels)) == len(labels) and labels[0] == "base"
        assert "decode a, b, c x10, unplanned" in labels and "trainer x4 per token" in labels
    assert any(c[0].startswith("workload.tail_alpha") for c in syn)
    assert not any(k in c[1] for c in trace for k in tail_sweep.SYNTHETIC_ONLY)
    assert len(syn) - len(trace) == sum(len(v) for k, v in tail_sweep.SWEEP_KEYS if k in tail_sweep.SYNTHETIC_ONLY)


@pytest.mark.parametrize("wl", ["bimodal", "azure_code_x8"])
@pytest.mark.parametrize("D", [32, 64])
def test_more_cells_are_valid_configs_that_change_what_they_name(tmp_path, wl, D):
    (tmp_path / "azure_llm_trace_2023_code.csv").write_text("ContextTokens,GeneratedTokens\n100,200\n300,40\n")
    cells = tail_sweep.sweep_more_cells(wl, D)
    labels = [c[0] for c in cells]
    assert len(set(labels)) == len(labels) and labels[0] == "base" and cells[0][1] == {}
    base = tail_common._cfg(wl, tmp_path, 512, D, {})
    for label, over, mm in cells[1:]:
        assert mm is None and over, label
        cfg = tail_common._cfg(wl, tmp_path, 512, D, over)     # loads and validates (ConfigError otherwise)
        for key, v in over.items():
            group, name = key.split(".")
            got, was = getattr(getattr(cfg, group), name), getattr(getattr(base, group), name)
            want = str(v).lower() == "true" if isinstance(got, bool) else type(got)(v)
            assert got == want != was, (label, key, got, was)
    # none is a cell of the documented sweep; the synthetic generator's keys stay off the traces
    documented = [{k: v} for k, vs in tail_sweep.SWEEP_KEYS for v in vs]
    assert not any(o in documented for _, o, _ in cells)
    if wl.startswith("azure"):
        assert not any(k in o for _, o, _ in cells for k in tail_sweep.SYNTHETIC_ONLY)


def test_more_selects_the_second_list(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bench_tail, "sweep", seen.append)
    assert bench_tail.main(["sweep", "--more", "--devices", "64"]) == 0 and seen[0].more
    with pytest.raises(SystemExit) as e:
        bench_tail.main(["ablation", "--more"])
    assert e.value.code == 2 and "--more applies to sweep only" in capsys.readouterr().err


def _trace_dir(tmp_path):
    (tmp_path / "azure_llm_trace_2023_code.csv").write_text("ContextTokens,GeneratedTokens\n100,200\n300,40\n")
    return tmp_path


@pytest.mark.parametrize("wl", ["bimodal", "azure_code_x8"])
def test_combos_are_reproducible_distinct_and_parse_back(tmp_path, wl):
    import tail_combos

    pool = tail_combos.combo_pool(wl, _trace_dir(tmp_path), 512, 32)
    singles = {c[0] for c in tail_sweep.sweep_cells(wl, tmp_path, 512, 32)[1:] + tail_sweep.sweep_more_cells(wl, 32)[1:]}
    assert {c[0] for c in pool} == singles
    combos, skipped = tail_combos.draw_combos(pool, 15, 0, wl, 32)
    again, _ = tail_combos.draw_combos(pool, 15, 0, wl, 32)
    other, _ = tail_combos.draw_combos(pool, 15, 0, wl, 64)
    labels = [tail_combos.SEP.join(c[0] for c in cs) for cs in combos]
    assert len(combos) == 15 and len(set(labels)) == 15
    assert labels == [tail_combos.SEP.join(c[0] for c in cs) for cs in again]
    assert labels != [tail_combos.SEP.join(c[0] for c in cs) for cs in other]
    for label, cs in zip(labels, combos):
        assert 2 <= len(cs) <= 4 and tail_combos.conflict(cs) is None
        assert sum(c[4] == "unplanned" for c in cs) <= 1
        assert tail_combos.parse_combo(label, pool) == cs
    # conflicts are refused by name, not run
    with pytest.raises(ValueError, match="set twice"):
        tail_combos.parse_combo("train.group_size=4 + G = 16 in one mini-batch", pool)
    with pytest.raises(ValueError, match="two unplanned"):
        tail_combos.parse_combo("decode a x10, unplanned + decode b x10, unplanned", pool)
    with pytest.raises(ValueError, match="not a change"):
        tail_combos.parse_combo("train.group_size=4 + no such change", pool)


def test_a_known_cost_change_scales_the_combinations_own_costs():
    import tail_combos

    pool = tail_combos.combo_pool("bimodal", None, 512, 32)
    label, over, mm = tail_combos.combo_cell("bimodal", None, 512, 32, tail_combos.parse_combo(
        "decode a x10, planned + model 32b, TP 4 + KV cache 200k tokens an instance", pool))
    assert mm is None and label.startswith("decode a x10, planned + model 32b")
    ref = _costs(tail_common._cfg("bimodal", None, 512, 32, {"sim.model_class": "32b", "sim.infer_tp": 4,
                                                               "rollout.kv_cache_tokens": 200000}))
    got = _costs(tail_common._cfg("bimodal", None, 512, 32, over()))
    assert got.instance.decode_a == pytest.approx(10 * ref.instance.decode_a)
    assert got.instance.decode_b == pytest.approx(ref.instance.decode_b)
    assert got.train_per_token == pytest.approx(ref.train_per_token) and got.kv_capacity == ref.kv_capacity
    assert (got.sync_s, got.train_per_step) == (ref.sync_s, ref.train_per_step)
    _, _, mm = tail_combos.combo_cell("bimodal", None, 512, 32, tail_combos.parse_combo(
        "train.group_size=4 + decode c x0.1, unplanned", pool))
    assert mm.decode_c == 0.1 and mm.decode_a == 1.0


def test_combo_only_runs_one_row_and_a_refused_config_is_a_row(capsys):
    assert bench_tail.main(["sweep", "--combo-only", "train.group_size=4 + rollout.max_num_seqs=32", "--prompts", "512",
                            "--workloads", "bimodal"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| bimodal |")]
    assert len(rows) == 1 and "train.group_size=4 + rollout.max_num_seqs=32" in rows[0] and "refused" not in rows[0]
    args = bench_tail.argparse.Namespace(plan_seeds=[0], set=[], devices=[32], workloads=["bimodal"], data=None,
                                         prompts=512, more=False)
    tail_sweep.sweep(args, lambda wl, D: [("G = 1", lambda: {"train.group_size": 1}, None)])
    out = capsys.readouterr().out
    assert "| bimodal | 32 | G = 1 | refused: ConfigError: train.group_size" in out
    assert "failed (1): bimodal / 32 / G = 1: refused" in out


def test_combos_options_are_checked(capsys):
    for argv, msg in [(["ablation", "--combos", "3"], "--combos applies to sweep only"),
                      (["sweep", "--more", "--combos", "3"], "without --more"),
                      (["sweep", "--combos", "0"], "a count of 1 or more"),
                      (["sweep", "--combos", "2", "--combo-only", "a + b"], "give one of them"),
                      (["sweep", "--combo-seed", "3"], "--combos only")]:
        with pytest.raises(SystemExit) as e:
            bench_tail.main(argv)
        assert e.value.code == 2 and msg in capsys.readouterr().err, argv
    with pytest.raises(SystemExit, match="not a change of sweep's lists"):
        bench_tail.main(["sweep", "--combo-only", "train.group_size=4 + nothing", "--workloads", "bimodal"])


def test_a_known_cost_change_keeps_a_class_only_key_priced_not_set():
    """weight sync 1 GB/s + costs known: the custom costs carry the 15 s sync, and the combination
    leaves out sim.sync_bandwidth_gbps, which the config refuses beside sim.model_class: custom."""
    import tail_combos

    pool = tail_combos.combo_pool("bimodal", None, 512, 32)
    _, over, _ = tail_combos.combo_cell("bimodal", None, 512, 32, tail_combos.parse_combo(
        "decode b x0.1, planned + weight sync 1 GB/s (15 s)", pool))
    o = over()
    assert "sim.sync_bandwidth_gbps" not in o and o["sim.model_class"] == "custom"
    slow = _costs(tail_common._cfg("bimodal", None, 512, 32, {"sim.sync_bandwidth_gbps": 1.0}))
    got = _costs(tail_common._cfg("bimodal", None, 512, 32, o))      # loads: no ConfigError
    assert got.sync_s == pytest.approx(slow.sync_s) and got.sync_s > 10
    assert got.instance.decode_b == pytest.approx(0.1 * slow.instance.decode_b)


def test_set_reaches_the_workload(monkeypatch):
    """sweep --set workload.epochs=3 gives every cell two history epochs: the workload sweep_run simulates is
    built with --set too (it was built from the cell alone, so the config said three epochs and the lengths
    had two: one history epoch, silently), and a cell's own change still wins."""
    import asp_ascend.lengths.workloads as workloads

    built = []
    real = workloads.workload_from_config
    monkeypatch.setattr(workloads, "workload_from_config", lambda cfg: built.append(cfg) or real(cfg))
    tail_sweep.sweep_run("bimodal", None, 256, 32, {}, None, {"workload.epochs": 3})
    tail_sweep.sweep_run("bimodal", None, 256, 32, {"workload.epochs": 4}, None, {"workload.epochs": 3})
    assert [c.workload.epochs for c in built] == [3, 4]
