"""Fuzz the config, dataset and length-history loaders: any malformed input ends in one
AspError (ConfigError/DataError) naming the file or key, never a library traceback."""
import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asp_ascend.config import load_config
from asp_ascend.data.datasets import load_prompts
from asp_ascend.errors import AspError
from asp_ascend.lengths.history import load_history

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=8))
KEYS = ["rollout.num_instances", "train.global_batch_size", "train.mini_batch_size", "scheduler.policy",
        "pipeline.lag_bound", "pipeline.mode", "lengths.max_response_length", "train.lr", "seed", "bogus.key",
        "rollout", "train", "workload.type", "data.path", "sim.rollout_devices", "lengths.quantile"]


def expect_clean(fn, path):
    try:
        fn()
    except AspError as exc:
        assert str(path.name) in str(exc) or "config" in str(exc)
    # any other exception type fails the test


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), st.one_of(scalars, st.lists(scalars, max_size=3),
                                                        st.dictionaries(st.text(max_size=5), scalars, max_size=3)),
                       max_size=6))
def test_fuzz_config_values(tmp_path_factory, mapping):
    from omegaconf import OmegaConf

    path = tmp_path_factory.mktemp("c") / "c.yaml"
    nested: dict = {}
    for key, val in mapping.items():
        node = nested
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[parts[-1]] = val
    try:
        path.write_text(OmegaConf.to_yaml(OmegaConf.create(nested)))
    except Exception:
        return  # not representable as YAML: nothing to load
    expect_clean(lambda: load_config(path, check_files=True), path)


@SETTINGS
@given(st.text(alphabet=string.printable, max_size=300))
def test_fuzz_config_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("c") / "c.yaml"
    path.write_text(text)
    expect_clean(lambda: load_config(path), path)


@SETTINGS
@given(st.text(alphabet=string.printable, max_size=30), st.text(max_size=30))
def test_fuzz_overrides(tmp_path_factory, key, value):
    path = tmp_path_factory.mktemp("c") / "c.yaml"
    path.write_text("{}\n")
    expect_clean(lambda: load_config(path, [f"{key}={value}", key]), path)


json_values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3),
                                                        st.dictionaries(st.text(max_size=5), c, max_size=3)),
                           max_leaves=6)


@SETTINGS
@given(st.lists(st.one_of(st.dictionaries(st.sampled_from(["id", "prompt", "answer", "x"]), json_values, max_size=4),
                          json_values, st.text(max_size=20)), max_size=6))
def test_fuzz_jsonl_dataset(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("d") / "d.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines))
    expect_clean(lambda: load_prompts(path), path)


@SETTINGS
@given(st.sampled_from(["csv", "jsonl"]),
       st.lists(st.sampled_from(["prompt_id", "response_length", "epoch", "sample", "prompt_length", "junk"]),
                min_size=1, max_size=5, unique=True),
       st.lists(st.lists(st.one_of(st.integers(-5, 5000), st.floats(allow_nan=True), st.text(max_size=4)),
                         min_size=0, max_size=6), max_size=6))
def test_fuzz_history(tmp_path_factory, fmt, cols, rows):
    path = tmp_path_factory.mktemp("h") / f"h.{fmt}"
    if fmt == "csv":
        body = [",".join(cols)] + [",".join(str(v).replace(",", ";").replace("\n", " ") for v in r) for r in rows]
        path.write_text("\n".join(body) + "\n")
    else:
        path.write_text("\n".join(json.dumps(dict(zip(cols, r))) for r in rows) + "\n")
    expect_clean(lambda: load_history(path, 4096), path)


@SETTINGS
@given(st.binary(max_size=200))
def test_fuzz_binary_garbage(tmp_path_factory, blob):
    d = tmp_path_factory.mktemp("b")
    for name, fn in (("x.parquet", load_history), ("y.parquet", load_prompts), ("z.csv", load_history),
                     ("w.jsonl", load_prompts)):
        p = d / name
        p.write_bytes(blob)
        expect_clean(lambda: fn(p), p)
