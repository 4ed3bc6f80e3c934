"""The ``clipper model split|shadow|traffic`` subcommands (canary splits and shadows)."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from clipper.client import Client
from clipper.errors import ConfigError

__all__ = ["add_rollout_commands", "run_rollout_command"]


def add_rollout_commands(model: Any, common: argparse.ArgumentParser) -> None:
    """Add ``split``, ``shadow`` and ``traffic`` under ``clipper model``."""
    m = model.add_parser(
        "split",
        parents=[common],
        help="split a model's queries between versions by weight (a canary)",
    )
    m.add_argument("name")
    m.add_argument(
        "weights",
        nargs="*",
        metavar="VERSION=WEIGHT",
        help="e.g. 1=95 2=5 (relative weights > 0); none: remove the split",
    )
    m.add_argument(
        "--sticky", action="store_true", help="a query's uid always goes to the same version"
    )
    m = model.add_parser(
        "shadow",
        parents=[common],
        help="copy a share of a model's queries to a version, only to compare its answers",
    )
    m.add_argument("name")
    m.add_argument("version", nargs="?", help="the shadow version (omit with --off)")
    m.add_argument("--share", type=float, default=1.0, help="0 to 1 (default 1: every query)")
    m.add_argument("--off", action="store_true", help="remove the shadow")
    m = model.add_parser(
        "traffic", parents=[common], help="a model's split and shadow, with their counts"
    )
    m.add_argument("name")


def parse_weights(pairs: list[str]) -> dict[str, float]:
    """``["1=95", "2=5"]`` as ``{"1": 95.0, "2": 5.0}`` (the server checks the values)."""
    out: dict[str, float] = {}
    for pair in pairs:
        version, sep, text = pair.partition("=")
        if not sep or not version:
            raise ConfigError(f"{pair!r}: write each version as VERSION=WEIGHT, e.g. 2=5")
        if version in out:
            raise ConfigError(f"version {version!r} is given twice")
        try:
            out[version] = float(text)
        except ValueError:
            raise ConfigError(f"{pair!r}: the weight must be a number") from None
    return out


def run_rollout_command(client: Client, args: argparse.Namespace) -> int | None:
    """Run ``clipper model split|shadow|traffic``; None for any other command."""
    if args.command != "model" or args.action not in ("split", "shadow", "traffic"):
        return None
    if args.action == "split":
        weights = parse_weights(args.weights)
        view = client.set_traffic_split(args.name, weights or None, sticky=args.sticky)
    elif args.action == "shadow":
        if args.off == (args.version is not None):
            raise ConfigError("give the shadow VERSION, or --off to remove the shadow")
        view = client.set_shadow(args.name, None if args.off else args.version, args.share)
    else:
        view = client.get_traffic(args.name)
    print(orjson.dumps(view).decode() if args.json else describe(view))
    return 0


def describe(view: dict[str, Any]) -> str:
    """The traffic view as a few human-readable lines."""
    lines = [f"model {view['model_name']}: current version {view.get('current_version')}"]
    shares = view.get("shares")
    if shares:
        parts = ", ".join(f"{v} {100 * s:.1f}%" for v, s in shares.items())
        lines.append(f"split: {parts}" + (" (sticky per uid)" if view.get("sticky") else ""))
    else:
        lines.append("split: none (the current version answers)")
    shadow = view.get("shadow")
    lines.append(
        f"shadow: {shadow['version']} on {100 * shadow['share']:.1f}% of queries"
        if shadow
        else "shadow: none"
    )
    stats = view.get("stats", {})
    for version, s in stats.get("split", {}).items():
        lines.append(f"  split {version}: {s['requests']} queries, {s['fallbacks']} fallbacks")
    for version, s in stats.get("shadow", {}).items():
        rate = s["agreement_rate"]
        agreement = "-" if rate is None else f"{100 * rate:.1f}%"
        lat = s["latency_ms"]
        lines.append(
            f"  shadow {version}: {s['sent']} sent, {s['compared']} compared, agreement "
            f"{agreement}, errors {s['errors'] or 0}, dropped {s['dropped']}, p99 real "
            f"{lat['real']['p99']} ms / shadow {lat['shadow']['p99']} ms"
        )
    return "\n".join(lines)
