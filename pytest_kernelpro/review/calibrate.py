"""The `kernelpro calibrate` command: re-measure the ceilings, cache them, print a table.

Output goes through rich's Console on sys.stdout (the plugin's no-print rule).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.measure.ceiling_probe import load_or_measure_ceilings, reprobe_summary
from pytest_kernelpro.measure.ceilings import (
    Ceilings,
    cache_path,
    default_cache_dir,
    format_rate,
    resolve_device,
)
from pytest_kernelpro.measure.devices import PEAK_KEYS, DeviceSpec, find_device_spec


def _ordered_keys(ceilings: Ceilings) -> list[str]:
    order = [*PEAK_KEYS, "bf16", "fp16"]
    return sorted(ceilings.flops, key=lambda k: (order.index(k) if k in order else len(order), k))


def ceilings_table(ceilings: Ceilings, spec: DeviceSpec | None = None) -> Any:
    """A rich Table of the ceilings, with the datasheet value and the ratio where known."""
    from rich.table import Table

    table = Table(
        title=f"kernelpro ceilings: {ceilings.device} (torch {ceilings.torch_version}, {ceilings.source})"
    )
    for column in ("ceiling", "value", "origin", "datasheet", "of datasheet", "measured on"):
        table.add_column(
            column, justify="left" if column in ("ceiling", "origin", "measured on") else "right"
        )

    def sheet(value: float | None, own: float, unit: str) -> tuple[str, str]:
        if value is None:
            return "-", "-"
        return format_rate(value, unit), f"{own / value:.0%}"

    copy = ceilings.details.get("copy") or {}
    copy_note = f"copy of {copy['bytes_moved'] / 2 / 2**20:.0f} MiB" if copy else ""
    table.add_row(
        "bandwidth",
        format_rate(ceilings.bandwidth_Bps, "B/s"),
        str(ceilings.details.get("bandwidth_origin", "measured")),
        *sheet(spec.dram_bandwidth_Bps if spec else None, ceilings.bandwidth_Bps, "B/s"),
        copy_note,
    )
    gemms = ceilings.details.get("gemm") or {}
    for key in _ordered_keys(ceilings):
        gemm = gemms.get(key)
        note = f"{gemm['dtype']} GEMM {gemm['n']}^3" if gemm else ""
        table.add_row(
            key,
            format_rate(ceilings.flops[key], "FLOP/s"),
            ceilings.origin(key),
            *sheet(spec.peak_flops.get(key) if spec else None, ceilings.flops[key], "FLOP/s"),
            note,
        )
    return table


def _calibrate_parser() -> argparse.ArgumentParser:
    """`kernelpro calibrate`'s arguments."""
    parser = argparse.ArgumentParser(
        prog="kernelpro calibrate",
        description="Measure this machine's roofline ceilings (copy bandwidth, GEMM FLOP/s per dtype) and cache them.",
    )
    parser.add_argument(
        "--device",
        metavar="DEVICE",
        default=None,
        help="cpu, cuda or cuda:N. Default: cuda when torch sees a GPU, else cpu",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        type=Path,
        default=None,
        help="Where the ceilings JSON goes. Default: $KERNELPRO_CACHE_DIR, else "
        f"{str(default_cache_dir())!r} (one cache per machine and user)",
    )
    parser.add_argument("--quick", action="store_true", help="Smaller sizes (seconds, less exact)")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="CPU: discard the cached ceilings instead of keeping the best of them and the "
        "new probe (load only ever lowers a probe; use after a hardware change)",
    )
    parser.add_argument(
        "--threads",
        metavar="N",
        type=int,
        default=0,
        help="CPU: torch threads to measure with (the plugin's --kernelpro-cpu-threads). "
        "Default: the thread policy's count (1)",
    )
    parser.add_argument(
        "--json", action="store_true", help="Print the ceilings as JSON instead of a table"
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        type=Path,
        default=None,
        help="Also write the ceilings (Ceilings.to_dict) to PATH, for the ceilings setting. Default: None",
    )
    return parser


def _print_ceilings(ceilings: Ceilings, spec: DeviceSpec | None, path: Path) -> int:
    """The measured ceilings as a table, what to trust of them and where they are cached;
    1 where they were too noisy to keep (kept only until a quiet session re-measures them)."""
    from rich.console import Console

    console = Console(file=sys.stdout, width=120)
    console.print(ceilings_table(ceilings, spec))
    load, cores = ceilings.details.get("loadavg_1m"), ceilings.details.get("cpu_count")
    if load is not None and cores and load > cores:
        console.print(
            f"note: the machine was busy (load {load:.1f} on {cores} cores); "
            "re-run on an idle machine for ceilings that kernels can reach"
        )
    wall = ceilings.details.get("wall_s", 0.0)
    if ceilings.details.get("not_cached"):
        console.print(
            f"{ceilings.details['not_cached']}: kept in {path} only until a quiet session "
            f"re-measures them; re-run on a quiet machine ({wall:.1f} s to measure)",
            markup=False,
        )
        return 1
    if ceilings.device_type == "cpu":
        trust = ceilings.trust_reason()
        if int(ceilings.details.get("reprobes") or 0):
            trust = f"{trust}; {reprobe_summary(ceilings)}"
        console.print(trust, markup=False)
    console.print(f"cached in {path} ({wall:.1f} s to measure)")
    return 0


def calibrate_main(argv: list[str], *, extra_specs: tuple[DeviceSpec, ...] = ()) -> int:
    """`kernelpro calibrate [--device cuda] [--cache-dir DIR] [--quick] [--json] [--out PATH]`.

    Re-measures the ceilings, writes them to the cache and prints a table (or JSON).
    Returns the exit status: 0 on success, 2 on a bad argument or a failed measurement.
    """
    parser = _calibrate_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already wrote the usage or the help
        return int(exc.code or 0)
    if args.cache_dir is None:
        args.cache_dir = default_cache_dir()
    try:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        device_type, name, _ = resolve_device(device)
        spec = find_device_spec(name, extra_specs) if device_type == "cuda" else None
        threads = None
        if device_type == "cpu":
            from pytest_kernelpro.measure.timing.cpu_load import policy_threads

            threads = policy_threads(args.threads)
        before = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            ceilings = load_or_measure_ceilings(
                device,
                args.cache_dir,
                spec=spec,
                refresh=True,
                quick=args.quick,
                replace_cached=args.replace,
            )
        finally:
            torch.set_num_threads(before)
    except KernelproError as exc:
        sys.stderr.write(f"kernelpro calibrate: {exc}\n")
        return 2
    path = cache_path(args.cache_dir, ceilings.device, ceilings.torch_version, args.quick, threads)
    if args.out is not None:
        atomic_write_json(args.out, ceilings.to_dict())
    if args.json:
        sys.stdout.write(json.dumps(ceilings.to_dict(), indent=2) + "\n")
        return 0
    return _print_ceilings(ceilings, spec, path)
