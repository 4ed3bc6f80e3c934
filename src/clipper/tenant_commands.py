"""The ``clipper tenant`` subcommands: tenants, their quotas and class, and their API keys
(docs/tenants.md)."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from clipper.client import Client
from clipper.errors import ConfigError

__all__ = ["add_tenant_commands", "parse_quotas", "run_tenant_command"]

_CLASSES = ("critical", "standard", "sheddable")


def add_tenant_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``clipper tenant add|update|delete|list|key|revoke``."""
    tenant = sub.add_parser("tenant", help="tenants, quotas, classes and API keys").add_subparsers(
        dest="action", required=True
    )
    quota_help = (
        "a quota, repeatable: SCOPE=RATE/BURST, SCOPE '*' (every application together) or an "
        "application's name; e.g. '*=100/200' digits=10/20"
    )
    t = tenant.add_parser("add", parents=[common], help="add a tenant")
    t.add_argument("name")
    t.add_argument("--priority", choices=_CLASSES, default="standard")
    t.add_argument(
        "--quota", action="append", default=[], metavar="SCOPE=RATE/BURST", help=quota_help
    )
    t = tenant.add_parser("update", parents=[common], help="change a tenant's class or quotas")
    t.add_argument("name")
    t.add_argument("--priority", choices=_CLASSES)
    t.add_argument(
        "--quota", action="append", metavar="SCOPE=RATE/BURST", help=quota_help + " (replaces them)"
    )
    t.add_argument("--no-quotas", action="store_true", help="remove every quota")
    t = tenant.add_parser("delete", parents=[common], help="delete a tenant and its keys")
    t.add_argument("name")
    tenant.add_parser("list", parents=[common], help="tenants with their quotas and key ids")
    t = tenant.add_parser("key", parents=[common], help="create an API key (shown only once)")
    t.add_argument("tenant")
    t.add_argument(
        "--priority", choices=_CLASSES, help="the key's own class (at most the tenant's)"
    )
    t = tenant.add_parser("revoke", parents=[common], help="revoke an API key by its id")
    t.add_argument("tenant")
    t.add_argument("key_id")


def parse_quotas(specs: list[str]) -> dict[str, dict[str, float]]:
    """``["*=100/200", "a=1.5/3"]`` as the admin API's quotas (the server checks the values)."""
    out: dict[str, dict[str, float]] = {}
    for spec in specs:
        scope, sep, rest = spec.partition("=")
        rate, slash, burst = rest.partition("/")
        if not sep or not slash or not scope:
            raise ConfigError(f"{spec!r}: write a quota as SCOPE=RATE/BURST, e.g. '*=100/200'")
        if scope in out:
            raise ConfigError(f"a quota for {scope!r} is given twice")
        try:
            out[scope] = {"rate": float(rate), "burst": int(burst)}
        except ValueError:
            raise ConfigError(f"{spec!r}: RATE is a number, BURST an integer") from None
    return out


def run_tenant_command(client: Client, args: argparse.Namespace) -> int | None:
    """Run ``clipper tenant ...``; None for any other command."""
    if args.command != "tenant":
        return None
    out: Any
    if args.action == "add":
        out = client.add_tenant(args.name, priority=args.priority, quotas=parse_quotas(args.quota))
    elif args.action == "update":
        changes: dict[str, Any] = {}
        if args.priority is not None:
            changes["priority"] = args.priority
        if args.no_quotas:
            changes["quotas"] = {}
        elif args.quota:
            changes["quotas"] = parse_quotas(args.quota)
        out = client.update_tenant(args.name, **changes)
    elif args.action == "delete":
        client.delete_tenant(args.name)
        out = f"deleted tenant {args.name} and its keys"
    elif args.action == "list":
        out = client.list_tenants()
        if not args.json:
            out = "\n".join(_line(t) for t in out) or "no tenants"
    elif args.action == "key":
        made = client.create_key(args.tenant, priority=args.priority)
        out = made if args.json else (
            f"{made['key']}\n(key id {made['key_id']} of tenant {made['tenant']}: the key is "
            "shown only now; send it as 'Authorization: Bearer <key>' or 'X-Api-Key: <key>')"
        )  # fmt: skip
    else:
        client.delete_key(args.tenant, args.key_id)
        out = f"revoked key {args.key_id} of tenant {args.tenant}"
    print(out if isinstance(out, str) else orjson.dumps(out).decode())
    return 0


def _line(t: dict[str, Any]) -> str:
    quotas = ", ".join(f"{s}={q['rate']:g}/{q['burst']}" for s, q in t["quotas"].items())
    keys = ", ".join(k["key_id"] for k in t["keys"])
    return f"{t['name']}: {t['priority']}; quotas {quotas or 'none'}; keys {keys or 'none'}"
