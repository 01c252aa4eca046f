"""Unit tests of the guards the reliability suite relies on: redaction, safe writes, the result bound,
the flight-recorder data budget and the arithmetic count of matmul ranges."""

import os
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.engine.bounds import bound_result
from tools.engine.redact import MASK, redact, redact_data
from tools.engine.spec import ToolFailure
from tools.shared.flight_recorder import UnsafeDump, expanded_units
from tools.matmul_bench import MatmulBenchParams
from tools.shared.safe_write import output_path, write_output


@pytest.mark.parametrize("line,secret", [
    ("export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789", "hf_abc"),
    ('curl -H "Authorization: Bearer eyJhbGciOi.abc.def" https://x', "eyJhbGciOi"),
    ("db password: hunter2", "hunter2"),
    ("key AKIAIOSFODNN7EXAMPLE in use", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("git clone https://bob:s3cr3t@github.com/x/y", "s3cr3t"),
    ('{"api_key": "abc123def"}', "abc123def"),
    ("train.py --wandb-api-key=0123abcd", "0123abcd"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
])
def test_redact_removes_secrets_in_common_forms(line, secret):
    out = redact(line)
    assert secret not in out and MASK in out


@pytest.mark.parametrize("line", ["num_tokens=4096 max_tokens: 512", "step 300 loss 2.1 tokens/s 41000",
                                  "NCCL WARN Timeout rank 3", "keyboard interrupt"])
def test_redact_leaves_ordinary_lines_alone(line):
    assert redact(line) == line


def test_redact_data_masks_secret_keys_and_strings():
    assert redact_data({"password": "x", "rows": ["token=abc"], "tokens": 3}) == {
        "password": MASK, "rows": [f"token={MASK}"], "tokens": 3}


def test_safe_write_relative_to_cwd_and_overwrite_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = output_path("out.txt", "plots", "unused")
    assert target == tmp_path / "out.txt"
    write_output(target, "one")
    with pytest.raises(ToolFailure, match="already exists.*overwrite=true"):
        write_output(target, "two")
    write_output(target, "two", overwrite=True)
    assert target.read_text() == "two"


def test_safe_write_default_goes_under_mleng_home(mleng_home):
    assert output_path(None, "plots", "x.png") == mleng_home / "plots" / "x.png"
    assert (mleng_home / "plots").is_dir()


def test_safe_write_refuses_a_symlink_even_with_overwrite(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(ToolFailure, match="symbolic link"):
        write_output(tmp_path / "link", "x", overwrite=True)
    assert victim.read_text() == "precious"


def test_safe_write_fifo_fails_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ToolFailure, match="FIFO"):
        write_output(tmp_path / "fifo", "x", overwrite=True)


def test_safe_write_errors_are_clear(tmp_path):
    with pytest.raises(ToolFailure, match="directory .* does not exist"):
        write_output(tmp_path / "no" / "such" / "file", "x")
    with pytest.raises(ToolFailure, match="is a device"):
        write_output(output_path("/dev/full", "x", "y"), "x", overwrite=True)


def test_expanded_units_is_identity_aware():
    x: list = []
    for _ in range(22):
        x = [x, x]
    with pytest.raises(UnsafeDump, match="expand to more than"):
        expanded_units(x, 100_000)
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(UnsafeDump, match="contains itself"):
        expanded_units(cycle, 100_000)
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(UnsafeDump, match="nested more than"):
        expanded_units(deep, 100_000)
    assert expanded_units({"a": [1, 2, "x" * 640]}, 100) == 1 + 1 + (1 + 1 + 1 + 11)


def test_real_dumps_are_well_within_the_budget():
    from pathlib import Path

    for p in (Path(__file__).parent / "fixtures" / "flight_recorder").rglob("fr_*"):
        if p.suffix == "":
            data = pickle.loads(p.read_bytes())
            assert expanded_units(data, 10**9) < p.stat().st_size, p


def test_a_small_result_is_returned_untouched():
    from tools.accelerator_specs import SPEC

    result = SPEC.Result(verdict="ok", findings=["fine"])
    assert bound_result(SPEC, result) is result


ranges = st.one_of(st.just([]), st.tuples(st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 700)).map(
    lambda t: [min(t[0], t[1]), max(t[0], t[1]), t[2]]))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(1, 3000), max_size=20), rng=ranges)
def test_dim_count_equals_the_expanded_count(values, rng):
    params = MatmulBenchParams(mode="grid", m=values, m_range=rng, n=[64], k=[64])
    assert params.dim_count("m") == len(params.dims("m"))
    assert params.largest_dim("m") == max(params.dims("m"), default=0)
