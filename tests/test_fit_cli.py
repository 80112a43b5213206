"""``bayesprism fit`` on Parquet tables: JSON summary and exit code 2 on bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
from posterior_builders import tiny_kernel_table, tiny_spec

from bayesprism.cli.main import main
from bayesprism.schema import write_table


def test_fit_cli_json_summary(tmp_path, capsys):
    table = tmp_path / "table.parquet"
    write_table(tiny_kernel_table(), table)
    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec().to_toml())
    out = tmp_path / "post.nc"
    code = main(["fit", str(table), "-o", str(out), "--spec", str(spec), "--draws", "60",
                 "--tune", "100", "--sampler", "nutpie", "--random-seed", "1", "--json", "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"max_rhat", "min_ess_bulk", "divergences", "seconds", "variance_components",
            "path"} <= set(summary)
    assert summary["path"] == str(out) and out.is_file()
    components = summary["variance_components"]
    assert set(components) == {"elementwise", "gemm", "allreduce"}
    gemm = components["gemm"]
    assert gemm["node"] is None and gemm["step"] is None  # levels not fitted by the tiny spec
    assert 0.01 < gemm["gpu"] < 0.3 and 0.01 < gemm["residual"] < 0.2


def test_fit_cli_exits_2_with_one_line_per_problem(tmp_path, capsys):
    bad = tiny_kernel_table().astype({"run": str, "node": str, "kernel": str,
                                      "kernel_class": str})
    bad = pd.DataFrame(bad)
    bad.loc[:4, "duration_us"] = -1.0
    bad.loc[:1, "step"] = -3
    path = tmp_path / "bad.parquet"
    bad.to_parquet(path)
    code = main(["fit", str(path), "-o", str(tmp_path / "p.nc"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}: duration_us: must be > 0 µs (5 rows), e.g. -1.0",
                   f"error: {path}: step: must be >= 0 (2 rows), e.g. -3"]
    code = main(["fit", str(tmp_path / "missing.parquet"), "-o", str(tmp_path / "p.nc")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_fit_cli_prints_a_summary_table(tmp_path, capsys):
    table = tmp_path / "table.parquet"
    write_table(tiny_kernel_table(), table)
    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec().to_toml())
    code = main(["fit", str(table), "-o", str(tmp_path / "post.nc"), "--spec", str(spec),
                 "--draws", "30", "--tune", "50", "--sampler", "nutpie", "--quiet"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"saved {tmp_path / 'post.nc'} (kernel model, sampler nutpie")
    assert lines[1].startswith("max R-hat ")
    assert lines[2] == "variance components (CV per level, posterior median):"
    assert lines[3].split() == ["node", "gpu", "step", "residual"]
    assert sorted(line.split()[0] for line in lines[4:7]) == ["allreduce", "elementwise", "gemm"]
    # how the fit used the rows: the collective without a cost model fitted as a kernel
    assert lines[7:] == ["note: collective classes without a cost model (no bytes/group size) "
                         "fitted as kernels: allreduce; on transfer_us for 0 of 96 launches "
                         "(waiting split off at ingest), else on duration_us, which includes "
                         "waiting"]


def test_fit_cli_records_a_stated_layout_in_the_posterior(tmp_path, capsys, shared_data):
    """NVIDIA's GPT-3 logs do not record the 12 virtual stages: --layout states them and the
    step model fits with them (the posterior's run layouts say so)."""
    import xarray as xr

    folder = shared_data / "mlperf/training_results_v3.1/NVIDIA/results/eos_n64_ngc23.09_nemo"
    out = tmp_path / "post.nc"
    code = main(["fit", str(folder), "-o", str(out), "--layout", "virtual_stages=12",
                 "--draws", "10", "--tune", "10", "--chains", "1", "--sampler", "nutpie",
                 "--seed", "1", "--json", "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["model_kind"] == "step"
    with xr.open_datatree(out) as tree:
        layouts = json.loads(tree["posterior"].attrs["run_layouts"])
    assert set(layouts) == {f"eos_n64_ngc23.09_nemo/gpt3/result_{i}" for i in range(3)}
    for layout in layouts.values():
        # 512 GPUs as tp 4 x pp 8 x dp 16 (config and log), 12 virtual stages (stated)
        assert (layout["virtual_stages"], layout["tp"], layout["pp"], layout["dp"]) == (
            12, 4, 8, 16)


def test_earlier_option_spellings_still_work_with_a_warning(tmp_path, capsys):
    """Issue 18: --model/--seed/--out are now --spec/--random-seed/--output; the old spellings
    run the same command and say so in its warning summary (for one release)."""
    import warnings

    from bayesprism.checks.validate import validate

    table = tmp_path / "table.parquet"
    write_table(tiny_kernel_table(), table)
    spec = tmp_path / "tiny.toml"
    spec.write_text(tiny_spec().to_toml())
    code = main(["fit", str(table), "-o", str(tmp_path / "post.nc"), "--model", str(spec),
                 "--draws", "20", "--tune", "20", "--chains", "1", "--sampler", "pymc",
                 "--seed", "3"])
    assert code == 0
    err = capsys.readouterr().err
    assert "--model is now --spec" in err and "--seed is now --random-seed" in err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = validate(tiny_kernel_table(), split="nodes", methods=("pooled",), draws=20,
                       seed=4)
    assert any(issubclass(w.category, FutureWarning) and "'random_seed'" in str(w.message)
               for w in caught)
    new = validate(tiny_kernel_table(), split="nodes", methods=("pooled",), draws=20,
                   random_seed=4)
    assert old.equals(new)


def test_fit_cli_names_the_rows_it_could_not_fit(tmp_path, capsys):
    # collectives under the cost model need their transfer (waits split off at ingest): the
    # first launch of each step has none here, so it is counted, not dropped silently
    rows = tiny_kernel_table()
    collective = rows["kernel_class"] == "allreduce"
    rows["transfer_us"] = np.where(collective & (rows["occurrence"] > 0),
                                   0.9 * rows["duration_us"], np.nan)
    unsplit = int((collective & (rows["occurrence"] == 0)).sum())
    table = tmp_path / "table.parquet"
    write_table(rows, table)
    spec = tmp_path / "ring.toml"
    spec.write_text(dataclasses.replace(tiny_spec(), collective_model="ring").to_toml())
    code = main(["fit", str(table), "-o", str(tmp_path / "post.nc"), "--spec", str(spec),
                 "--draws", "30", "--tune", "50", "--sampler", "nutpie", "--quiet"])
    assert code == 0
    skipped = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("skipped:")]
    assert skipped == [f"skipped: {unsplit:,} collective rows of a modelled class without a "
                       "wait/transfer split (transfer_us: members without a trace file, see the "
                       "ingest notes), bytes or group_size"]


def test_fit_notes_and_skipped_rows_read_back_as_the_artifact_stores_them():
    import xarray as xr

    from bayesprism.cli.fit import _fit_attr

    def tree(**attrs):
        return xr.DataTree.from_dict({"posterior": xr.Dataset(attrs=attrs)})

    assert _fit_attr(tree(notes=""), "notes", []) == []  # an empty list is stored as ""
    assert _fit_attr(tree(notes="one"), "notes", []) == ["one"]
    assert _fit_attr(tree(notes=np.array(["a", "b"])), "notes", []) == ["a", "b"]
    assert _fit_attr(tree(skipped='{"rows without bytes": 3}'), "skipped", {}) == {
        "rows without bytes": 3}
    assert _fit_attr(tree(), "skipped", {}) == {}
