"""The same seed gives the same numbers, a different seed different ones: fit, forecast,
validate, sensitivity and place through the CLI (issue "Hostile input and faults", point 6)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from posterior_builders import analysis_posterior, tiny_kernel_table

from bayesprism import io
from bayesprism.cli.main import main
from bayesprism.schema import write_table


def _json(capsys, args: list[str]) -> dict:
    assert main([*args, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """A saved analysis posterior with a measured node 3 sd slow, and a pipeline plan."""
    folder = tmp_path_factory.mktemp("seeds")
    post = analysis_posterior(draws=6, node_effect={f"n{i}": (3.0 if i == 5 else 0.0)
                                                    for i in range(8)},
                              scales={"node": {"gemm": 0.1}, "gpustep": {"gemm": 0.05}})
    io.save(post, folder / "posterior.nc")
    (folder / "plan.toml").write_text("dp = 2\ntp = 2\npp = 4\nmicrobatches = 8\n"
                                      "gpus_per_node = 2\nactivation_bytes = 1e6\n")
    return folder


@pytest.mark.parametrize("command", ["sensitivity", "place"])
def test_analyses_repeat_with_their_seed(scene, capsys, command):
    args = [command, str(scene / "posterior.nc"), "--plan", str(scene / "plan.toml"),
            "--draws", "3", "--replicates", "4"]
    first = _json(capsys, [*args, "--seed", "3"])
    assert _json(capsys, [*args, "--seed", "3"]) == first
    assert _json(capsys, [*args, "--seed", "4"]) != first


def test_forecasts_repeat_with_their_seed(scene, capsys, tmp_path):
    def run(seed: int) -> dict:
        out = tmp_path / f"forecast-{seed}.json"
        args = ["forecast", str(scene / "posterior.nc"), "--plan", str(scene / "plan.toml"),
                "--draws", "4", "--replicates", "4", "--random-seed", str(seed), "-o", str(out),
                "--quiet"]
        assert main(args) == 0
        return json.loads(out.read_text())

    first = run(1)
    assert run(1) == first
    assert run(2) != first


def test_fit_and_validate_repeat_with_their_seed(tmp_path, capsys):
    table = write_table(tiny_kernel_table(), tmp_path / "table.parquet")

    def fit(seed: int) -> np.ndarray:
        out = tmp_path / f"posterior-{seed}.nc"
        assert main(["fit", str(table), "-o", str(out), "--draws", "20", "--tune", "20",
                     "--chains", "1", "--sampler", "pymc", "--random-seed", str(seed),
                     "--quiet"]) == 0
        return io.load(out)["posterior"]["kernel_log_median"].to_numpy()

    first = fit(0)
    np.testing.assert_array_equal(fit(0), first)
    assert not np.array_equal(fit(1), first)
    capsys.readouterr()  # fit's "saved ..." lines

    def validate(seed: int) -> dict:
        return _json(capsys, ["validate", "--fit", str(table), "--split", "nodes", "--draws",
                              "50", "--methods", "pooled", "--random-seed", str(seed)])

    scores = validate(0)
    assert validate(0) == scores
    assert validate(5) != scores
