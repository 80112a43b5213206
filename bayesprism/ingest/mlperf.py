"""MLPerf Training result logs (``:::MLLOG`` lines) → step-level rows of the trace table.

One log file is one run. Rows are per optimizer step (``kernel_class = "step"``,
``kernel = "train_step"``, ``rank = -1``, ``gpu = -1``, ``node = "*"``) with ``duration_us`` from
``tracked_stats`` entries carrying ``train_step_time`` (Llama, v5.x) or ``train_step_timing``
(GPT-3, v3.x), both in seconds. When a log has no per-step timing, its training blocks
(``block_start``/``block_stop``) become rows with ``kernel = "train_block"`` instead (noted).

Choices worth knowing:

* ``step`` is the 0-based optimizer step index. Logs whose ``metadata.step`` counts *tokens*
  (GPT-3 v3.1: 4194304, 8388608, ...) are recognised because every value is a multiple of
  ``global_batch_size × max_sequence_length``; the index is then ``tokens / (gbs × seq) − 1``.
  Integer-valued step numbers are kept as logged (Llama: 31, 63, ... with
  ``LOG_EVERY_N_STEPS=32``). Anything else (or duplicates) falls back to the running index
  0, 1, 2, ... of the timed entries, with a note.
* ``train_step_time`` entries *without* ``metadata.step`` (the Llama logs write one per block: a
  block average, not one step) are skipped and counted under
  ``"train_step_time without metadata.step (per-block summary)"``.
* The run is ``<system>/<benchmark>/result_<n>`` when the file sits in the MLPerf repository
  layout ``<submitter>/results/<system>/<benchmark>/result_<n>.txt[.gz]``, else
  ``<parent folder>/<file stem>``.
* Run metadata comes from, in increasing priority: the ``config_<SYSTEM>_<nodes>x<gpus>x
  <minibs>x<TP>x<PP>...`` file name, the environment variables exported by that config script
  (and the scripts it ``source``-s; assignments inside ``if`` blocks are ignored because their
  condition is unknown), the system description ``<submitter>/systems/<system>.json``, and the
  values logged in the file (which are what actually ran). Disagreements are reported as notes.
  DP = GPUs / (TP × PP × CP); micro-batches per DP rank per step are the logged
  ``gradient_accumulation_steps`` (else global batch / (DP × micro-batch size)); a numeric
  ``INTERLEAVED_PIPELINE`` becomes ``plan["virtual_stages"]``.
* Layout facts the files do not record can be stated with ``layout=`` (checked by
  :func:`bayesprism.ingest.layout.check_layout`), e.g. ``{"virtual_stages": 12}`` for
  NVIDIA's GPT-3 v3.1 runs, whose interleaving is set in the implementation's
  ``conf/custom.yaml``, not in the log or ``config_*.sh``. Stated values have the highest
  priority (above the log) before dp and micro-batches are derived; disagreements are noted.
  ``run_meta["layout_sources"]`` names where each layout value came from: ``"user"``,
  ``"log"``, ``"config"``, ``"config file name"``, ``"system JSON"`` or ``"derived"``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import Problem, TraceFormatError
from bayesprism.ingest.files import read_text
from bayesprism.schema import ALL_NODES, ALL_RANKS

MARKER = ":::MLLOG"
STEP_TIME_KEYS = ("train_step_time", "train_step_timing")
SKIP_NO_STEP = "train_step_time without metadata.step (per-block summary)"
SKIP_BAD_TIME = "step time is missing, non-finite or <= 0"
SKIP_BAD_LINE = "unparseable :::MLLOG line"
_HYPER_KEYS = (
    "global_batch_size",
    "gradient_accumulation_steps",
    "max_sequence_length",
    "submission_benchmark",
    "submission_platform",
    "submission_org",
    "submission_division",
    "seed",
)
_CONFIG_NAME = re.compile(
    r"^config_(?P<system>.+?)_(?P<nodes>\d+)x(?P<gpus>\d+)x(?P<minibs>\d+)(?P<rest>.*)\.sh$"
)


def can_read(path: Path, head: bytes) -> bool:
    """True when the (decompressed) head of the file holds ``:::MLLOG`` lines."""
    return MARKER.encode() in head


def read_mlperf(path: Path, **options) -> tuple[pd.DataFrame, dict]:
    """Read one MLPerf Training result log into step-level trace-table rows.

    Parameters
    ----------
    path
        ``result_<n>.txt`` or ``result_<n>.txt.gz``.
    **options
        ``run``: override the run name; ``layout``: checked layout facts stated by the user
        (see the module docstring).

    Returns
    -------
    (pandas.DataFrame, dict)
        Rows in the trace-table schema and the report (``run``, ``skipped``, ``notes``,
        ``run_meta``).

    Raises
    ------
    TraceFormatError
        Unreadable/truncated file, no ``:::MLLOG`` lines, or no step or block timing at all.
    """
    path = Path(path)
    text = read_text(path)
    skipped: dict[str, int] = {}
    notes: list[str] = []
    hyper: dict[str, object] = {}
    steps: list[tuple[float, float]] = []  # (metadata.step, seconds)
    blocks: list[tuple[int, int]] = []  # (start ms, stop ms)
    timing_key = None
    block_start = None
    status = None
    n_lines = 0
    for line in text.splitlines():
        at = line.find(MARKER)
        if at < 0:
            continue
        n_lines += 1
        try:
            event = json.loads(line[at + len(MARKER) :])
            key = event["key"]
        except (ValueError, KeyError, TypeError):
            _count(skipped, SKIP_BAD_LINE)
            continue
        value = event.get("value")
        meta = event.get("metadata") or {}
        if key == "tracked_stats" and isinstance(value, dict):
            found = [k for k in STEP_TIME_KEYS if k in value]
            if not found:
                continue
            timing_key = timing_key or found[0]
            if "step" not in meta:
                _count(skipped, SKIP_NO_STEP)
                continue
            seconds = _as_float(value[found[0]])
            if seconds is None or not math.isfinite(seconds) or seconds <= 0:
                _count(skipped, SKIP_BAD_TIME)
                continue
            steps.append((float(meta["step"]), seconds))
        elif key in _HYPER_KEYS:
            hyper.setdefault(key, value)
        elif key == "block_start":
            block_start = event.get("time_ms")
        elif key == "block_stop" and block_start is not None:
            blocks.append((int(block_start), int(event.get("time_ms", block_start))))
            block_start = None
        elif key == "run_stop":
            status = meta.get("status")
    if n_lines == 0:
        raise TraceFormatError(Problem(str(path), MARKER, "no :::MLLOG lines in the file"))

    meta_run = _run_metadata(path, hyper, notes, options.get("layout") or {})
    run = options.get("run") or _run_name(path, hyper)
    if steps:
        logged = np.array([s for s, _ in steps])
        index = _step_index(
            logged, meta_run.get("global_batch"), meta_run.get("sequence_length"), notes
        )
        durations = np.array([d for _, d in steps]) * 1e6
        kernel = "train_step"
    elif blocks:
        index = np.arange(len(blocks))
        durations = np.array([(b - a) * 1e3 for a, b in blocks], dtype=float)
        keep = durations > 0
        if not keep.all():
            _count(skipped, "block time <= 0", int((~keep).sum()))
            index, durations = index[keep], durations[keep]
        kernel = "train_block"
        timing_key = "block_start/block_stop"
        notes.append(f"{path}: no per-step timing; rows are training blocks (kernel train_block)")
    else:
        raise TraceFormatError(
            Problem(
                str(path),
                "tracked_stats",
                "no train_step_time / train_step_timing entries and no block_start/block_stop "
                "pairs: nothing to time",
            )
        )
    if len(durations) == 0:
        raise TraceFormatError(
            Problem(
                str(path),
                timing_key or "tracked_stats",
                "every timing entry was invalid",
                sum(skipped.values()),
            )
        )
    n = len(durations)
    df = pd.DataFrame(
        {
            "run": [run] * n,
            "step": index.astype("int64"),
            "rank": np.full(n, ALL_RANKS, dtype="int64"),
            "node": [ALL_NODES] * n,
            "gpu": np.full(n, ALL_RANKS, dtype="int64"),
            "kernel": [kernel] * n,
            "kernel_class": ["step"] * n,
            "duration_us": durations.astype(float),
        }
    )
    meta_run.update({"timing_key": timing_key, "status": status, "timed_steps": n})
    return df, {"run": run, "skipped": skipped, "notes": notes, "run_meta": meta_run,
                "layout_applied": True}


# --------------------------------------------------------------------------- file access


def _count(skipped: dict[str, int], reason: str, n: int = 1) -> None:
    skipped[reason] = skipped.get(reason, 0) + n


def _as_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _as_int(value) -> int | None:
    number = _as_float(value)
    if number is None or not math.isfinite(number) or number != int(number):
        return None
    return int(number)


# --------------------------------------------------------------------------- steps and run name


def _step_index(logged: np.ndarray, global_batch, seq_len, notes: list[str]) -> np.ndarray:
    tokens_per_step = (global_batch or 0) * (seq_len or 0)
    if tokens_per_step and (logged > 0).all() and (np.mod(logged, tokens_per_step) == 0).all():
        index = (logged // tokens_per_step - 1).astype(np.int64)
        notes.append(
            "metadata.step counts tokens; step = tokens / (global_batch_size × "
            f"max_sequence_length = {tokens_per_step}) − 1"
        )
    elif (logged >= 0).all() and (logged == np.round(logged)).all():
        index = logged.astype(np.int64)
    else:
        index = np.arange(len(logged), dtype=np.int64)
        notes.append("metadata.step is not an integer step index; step = running index")
    if len(np.unique(index)) != len(index):
        notes.append("repeated step numbers in the log; step = running index of the timed entries")
        index = np.arange(len(logged), dtype=np.int64)
    return index


def _layout(path: Path) -> tuple[Path, str, str] | None:
    """(submitter folder, system, benchmark) when ``path`` sits in the MLPerf repository layout."""
    parents = path.resolve().parents
    if len(parents) > 3 and parents[2].name == "results":
        return parents[3], parents[1].name, parents[0].name
    return None


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".txt", ".log"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _run_name(path: Path, hyper: dict) -> str:
    layout = _layout(path)
    if layout:
        return f"{layout[1]}/{layout[2]}/{_stem(path)}"
    return f"{path.parent.name}/{_stem(path)}"


# --------------------------------------------------------------------------- run metadata


def _run_metadata(path: Path, hyper: dict, notes: list[str], stated: dict | None = None) -> dict:
    stated = dict(stated or {})
    layout = _layout(path)
    sources = [str(path)]
    system: dict = {}
    config_env: dict[str, str] = {}
    config_name: dict = {}
    system_id = benchmark = None
    if layout:
        root, system_id, benchmark = layout
        sys_file = root / "systems" / f"{system_id}.json"
        if sys_file.is_file():
            try:
                system = json.loads(sys_file.read_text())
                sources.append(str(sys_file))
            except ValueError:
                notes.append(f"{sys_file}: not valid JSON; system description ignored")
    benchmark = hyper.get("submission_benchmark") or benchmark
    logged_nodes = _platform_nodes(hyper.get("submission_platform"))
    nodes = _as_int(system.get("number_of_nodes")) or logged_nodes
    if layout and benchmark:
        config = _find_config(
            layout[0], str(benchmark), nodes, _as_int(system.get("accelerators_per_node")), notes
        )
        if config is not None:
            config_name = _parse_config_name(config.name)
            config_env = _read_config_env(config, sources)
            sources.insert(1, str(config))

    provenance: dict[str, str] = {}

    def pick(name: str, key: str | None, *candidates):
        if key is not None:
            candidates = (("user", stated.get(key)), *candidates)
        values = [(label, v) for label, v in candidates if v is not None]
        if not values:
            return None
        label, chosen = values[0]
        if key is not None:
            provenance[key] = label
        for other_label, other in values[1:]:
            if other != chosen:
                notes.append(
                    f"{name}: {label} says {chosen}, {other_label} says {other}; "
                    f"using {chosen} ({label})"
                )
        return chosen

    nodes = pick(
        "nodes", None,
        ("log", logged_nodes),
        ("system JSON", nodes),
        ("config", _as_int(config_env.get("DGXNNODES"))),
        ("config file name", config_name.get("nodes")),
    )
    gpus_per_node = pick(
        "gpus per node", "gpus_per_node",
        ("system JSON", _as_int(system.get("accelerators_per_node"))),
        ("config", _as_int(config_env.get("DGXNGPU"))),
        ("config file name", config_name.get("gpus")),
    )
    tp = pick(
        "TP", "tp",
        ("config", _as_int(config_env.get("TENSOR_MODEL_PARALLEL"))),
        ("config file name", config_name.get("tp")),
    )
    pp = pick(
        "PP", "pp",
        ("config", _as_int(config_env.get("PIPELINE_MODEL_PARALLEL"))),
        ("config file name", config_name.get("pp")),
    )
    cp = pick(
        "CP", "cp",
        ("config", _as_int(config_env.get("CONTEXT_PARALLEL"))),
        ("config file name", config_name.get("cp")),
    )
    mbs = pick("micro-batch size", "micro_batch_size",
               ("config", _as_int(config_env.get("MICRO_BATCH_SIZE"))))
    for label, value in (("TP", tp), ("PP", pp), ("CP", cp)):
        if value is None:
            notes.append(f"{label} is not set by the launch config; {label} = 1")
    tp, pp, cp = tp or 1, pp or 1, cp or 1
    world = nodes * gpus_per_node if nodes and gpus_per_node else None
    dp = world // (tp * pp * cp) if world and world % (tp * pp * cp) == 0 else None
    if "dp" in stated:
        if dp is not None and dp != stated["dp"]:
            notes.append(f"dp: {world} GPUs / (TP·PP·CP) gives {dp}, user says "
                         f"{stated['dp']}; using {stated['dp']} (user)")
        dp = stated["dp"]
    provenance["dp"] = "user" if "dp" in stated else "derived"
    if world and dp is None:
        notes.append(f"{path}: {world} GPUs are not divisible by TP·PP·CP = {tp * pp * cp}")
    minibs = _as_int(config_env.get("MINIBS")) or config_name.get("minibs")
    global_batch = pick(
        "global batch", None,
        ("log", _as_int(hyper.get("global_batch_size"))),
        ("config MINIBS × DP", minibs * dp if minibs and dp else None),
    )
    logged_accumulation = _as_int(hyper.get("gradient_accumulation_steps"))
    accumulation = pick("micro-batches", "microbatches", ("log", logged_accumulation))
    if accumulation is None and global_batch and dp and mbs:
        accumulation = global_batch // (dp * mbs) or None
        provenance["microbatches"] = "derived"
    meta = {
        "platform": system.get("accelerator_model_name") or hyper.get("submission_platform"),
        "system": system.get("system_name") or system_id,
        "system_id": system_id,
        "submitter": system.get("submitter") or hyper.get("submission_org"),
        "benchmark": benchmark,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "accelerators_per_node": gpus_per_node,
        "world_size": world,
        "global_batch": global_batch,
        "sequence_length": _as_int(hyper.get("max_sequence_length")),
        "gradient_accumulation": accumulation,
        "micro_batch_size": mbs,
        "seed": hyper.get("seed"),
        "plan": {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "ep": 1,
            "microbatches": accumulation,
            "micro_batch_size": mbs,
        },
        "source_files": sources,
    }
    virtual = pick("virtual stages", "virtual_stages",
                   ("config", _as_int(config_env.get("INTERLEAVED_PIPELINE"))))
    if virtual and ((virtual > 1 and pp > 1) or provenance.get("virtual_stages") == "user"):
        meta["plan"]["virtual_stages"] = virtual
        if virtual > 1:
            meta["plan"]["schedule"] = "interleaved-1f1b"
    if stated.get("ep"):
        meta["plan"]["ep"] = stated["ep"]
    for key in ("schedule", "sharding", "overlap"):
        if key in stated:
            meta["plan"][key] = stated[key]
    provenance.update(dict.fromkeys(stated.keys() & {"ep", "schedule", "sharding", "overlap"},
                                    "user"))
    meta["layout_sources"] = {k: v for k, v in provenance.items()
                              if k in ("gpus_per_node", "virtual_stages") or k in meta["plan"]}
    if system:
        other = system.get("other_software_stack") or {}
        meta.update(
            {
                "accelerator_interconnect": system.get("accelerator_interconnect"),
                "host_networking": system.get("host_networking"),
                "framework": system.get("framework"),
                "nccl_version": other.get("nccl_version") if isinstance(other, dict) else None,
            }
        )
    return meta


def _platform_nodes(platform) -> int | None:
    match = re.match(r"^\s*(\d+)\s*x", str(platform or ""))
    return int(match.group(1)) if match else None


def _parse_config_name(name: str) -> dict:
    match = _CONFIG_NAME.match(name)
    if not match:
        return {}
    out = {k: int(match.group(k)) for k in ("nodes", "gpus", "minibs")}
    rest = match.group("rest")
    positional = re.match(r"^x(\d+)x(\d+)", rest)
    if positional:
        out["tp"], out["pp"] = int(positional.group(1)), int(positional.group(2))
    for key in ("tp", "pp", "cp"):
        named = re.search(rf"{key}(\d+)", rest)
        if named:
            out[key] = int(named.group(1))
    return out


def _find_config(
    root: Path, benchmark: str, nodes: int | None, gpus: int | None, notes: list[str]
) -> Path | None:
    base = root / "benchmarks" / benchmark / "implementations"
    if nodes is None or not base.is_dir():
        return None
    matches = []
    for candidate in sorted(base.glob("*/config_*.sh")):
        parsed = _parse_config_name(candidate.name)
        if parsed.get("nodes") == nodes and (gpus is None or parsed.get("gpus") == gpus):
            matches.append(candidate)
    if len(matches) > 1:
        notes.append(
            f"several configs for {nodes} nodes ({', '.join(m.name for m in matches)}); "
            f"using {matches[0].name}"
        )
    return matches[0] if matches else None


_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_DEFAULT = re.compile(r'^:\s+"?\$\{([A-Za-z_][A-Za-z0-9_]*):=([^}]*)\}"?')
_SOURCE = re.compile(r"^(?:source|\.)\s+(.+)$")


def _read_config_env(
    config: Path, sources: list[str], env: dict | None = None, depth: int = 0
) -> dict[str, str]:
    """Variables a launch config exports, following simple ``source`` lines (no shell run)."""
    env = {} if env is None else env
    if depth > 4:
        return env
    if_depth = 0
    for raw in config.read_text(errors="replace").splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if re.match(r"^if\b", line):
            if_depth += 0 if re.search(r"\bfi\s*$", line) else 1  # one-line if ... fi
            continue
        if line == "fi" or line.startswith("fi "):
            if_depth = max(0, if_depth - 1)
            continue
        if if_depth:
            continue
        source = _SOURCE.match(line)
        if source:
            target = _sourced_file(config, source.group(1))
            if target is not None:
                if str(target) not in sources:
                    sources.append(str(target))
                _read_config_env(target, sources, env, depth + 1)
            continue
        if line.startswith("unset "):
            for name in line.split()[1:]:
                env.pop(name, None)
            continue
        default = _DEFAULT.match(line)
        if default:
            env.setdefault(default.group(1), default.group(2).strip("'\""))
            continue
        assign = _ASSIGN.match(line)
        if assign:
            value = _expand(assign.group(2).strip().strip("'\""), env)
            if value is not None:
                env[assign.group(1)] = value
    return env


def _expand(value: str, env: dict[str, str]) -> str | None:
    """Resolve ``${VAR:-default}`` and ``$VAR``; ``None`` for anything computed by the shell."""
    if "$(" in value or "`" in value:
        return None
    value = re.sub(
        r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), value
    )
    if "$" in value:
        return None
    return value


def _sourced_file(config: Path, target: str) -> Path | None:
    name = Path(target.split()[-1].strip("'\"")).name
    for folder in (config.parent, *sorted(config.parent.parent.glob("*/"))):
        candidate = folder / name
        if candidate.is_file():
            return candidate
    return None
