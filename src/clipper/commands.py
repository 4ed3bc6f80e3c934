"""The ``clipper`` subcommands that talk to a running frontend through :class:`Client`.

Human-readable tables by default, ``--json`` for scripts. Exit codes scripts can trust:
0 done, 1 refused by the server (the message says why), 2 bad usage, 3 server unreachable.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson

from clipper.artifact_digest import content_digest
from clipper.choices import (
    CONTROLLERS,
    INPUT_TYPES,
    LOSSES,
    ON_MODEL_ERROR,
    OVERLOAD,
    POLICIES,
    WAITS,
)
from clipper.cli_ops import OPERATOR_COMMANDS, add_operator_commands, run_operator_command
from clipper.client import Client
from clipper.config import BatchingConfig
from clipper.errors import ClipperError, ConfigError, RegistryError, RequestError
from clipper.pipeline.describe import apply_description
from clipper.rollout_commands import add_rollout_commands, run_rollout_command
from clipper.tables import table
from clipper.tenant_commands import add_tenant_commands, run_tenant_command

__all__ = ["add_commands", "run_command"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
T = TypeVar("T")


def add_commands(sub: Any, env: Callable[[str, Any], Any]) -> None:
    """Add the client subcommands to the ``clipper`` parser."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--admin-url", default=env("ADMIN_URL", "http://127.0.0.1:1338"), help="[CLIPPER_ADMIN_URL]"
    )
    common.add_argument(
        "--url", default=env("URL", "http://127.0.0.1:1337"), help="query API [CLIPPER_URL]"
    )
    common.add_argument(
        "--token", default=env("ADMIN_TOKEN", None), help="admin bearer token [CLIPPER_ADMIN_TOKEN]"
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=env("JSON", "") in ("1", "true"),
        help="machine-readable output [CLIPPER_JSON]",
    )

    app = sub.add_parser("app", help="applications").add_subparsers(dest="action", required=True)
    a = app.add_parser("register", parents=[common], help="register an application")
    a.add_argument("name")
    a.add_argument("--input-type", required=True, help=INPUT_TYPES.help())
    a.add_argument(
        "--default-output",
        default="null",
        help="JSON text answered when no prediction arrives in time",
    )
    a.add_argument("--slo-micros", type=int, default=100_000, help="latency objective")
    a.add_argument("--no-cache", action="store_true")
    a.add_argument(
        "--require-key", action="store_true", help="refuse queries without an API key (401)"
    )
    a.add_argument("--overload", choices=OVERLOAD.names, default="default", help=OVERLOAD.help())
    a.add_argument(
        "--on-model-error",
        choices=ON_MODEL_ERROR.names,
        default="auto",
        help=ON_MODEL_ERROR.help(),
    )
    _selection_options(a)
    a = app.add_parser(
        "update",
        parents=[common],
        help="change an application's SLO, default output, cache or overload answer",
    )
    a.add_argument("name")
    a.add_argument("--slo-micros", type=int)
    a.add_argument("--default-output")
    a.add_argument("--cache", choices=("on", "off"))
    a.add_argument("--require-key", choices=("on", "off"), help="refuse queries without a key")
    a.add_argument("--overload", choices=OVERLOAD.names, help=OVERLOAD.help())
    a.add_argument("--on-model-error", choices=ON_MODEL_ERROR.names, help=ON_MODEL_ERROR.help())
    _selection_options(a)
    a = app.add_parser(
        "delete", parents=[common], help="delete an application (its routes and links too)"
    )
    a.add_argument("name")
    app.add_parser("list", parents=[common], help="list applications")
    a = app.add_parser(
        "pipeline",
        parents=[common],
        help="describe an application's pipeline of stages from a JSON/YAML file "
        "(docs/pipelines.md); registers the application when it does not exist",
    )
    a.add_argument("name")
    how = a.add_mutually_exclusive_group(required=True)
    how.add_argument("-f", "--file", type=Path, help="the description file")
    how.add_argument("--remove", action="store_true", help="make it a plain application again")

    model = sub.add_parser("model", help="models and versions").add_subparsers(
        dest="action", required=True
    )
    m = model.add_parser(
        "deploy", parents=[common], help="deploy a model version from a file or directory"
    )
    m.add_argument(
        "path",
        help="a model file, recognised by its content: a cloudpickle/joblib file (function, "
        "estimator, object with predict), a torch.save or TorchScript file, an XGBoost "
        ".json/.ubj model, a LightGBM text model, an ONNX file; or an artifact directory",
    )
    m.add_argument("--name", required=True)
    m.add_argument("--version", required=True)
    m.add_argument("--input-type", required=True, help=INPUT_TYPES.help())
    m.add_argument("--replicas", type=int, default=1)
    m.add_argument(
        "--pooled",
        action="store_true",
        help="serve it from a pool process, loaded on demand and unloaded when idle "
        "(the frontend needs --pool-processes; docs/density.md)",
    )
    m.add_argument(
        "--label",
        action="append",
        default=[],
        dest="labels",
        help="a label of the version (repeatable), e.g. local:gpus=0 to pin its replicas to a "
        "GPU (docs/deployers.md) or ray:num_gpus=1 on the ray:// manager",
    )
    m.add_argument(
        "--input-size",
        type=int,
        help="values per input the application sends: a model file declaring another width "
        "is refused, and the smoke prediction uses it when the file declares none",
    )
    m.add_argument(
        "--framework", help="force the framework (sklearn, torch, onnx, xgboost, lightgbm, python)"
    )
    m.add_argument(
        "--controller", choices=CONTROLLERS.names, default="aimd", help=CONTROLLERS.help()
    )
    m.add_argument("--max-batch-size", type=int)
    m.add_argument("--max-wait-micros", type=int, default=1000)
    m.add_argument("--wait", choices=WAITS.names, default="adaptive", help=WAITS.help())
    m = model.add_parser("scale", parents=[common], help="set the number of replicas")
    m.add_argument("name")
    m.add_argument("replicas", type=int)
    m.add_argument("--version")
    m = model.add_parser(
        "autoscale",
        parents=[common],
        help="scale a version's replicas to its latency SLO (docs/autoscaling.md)",
    )
    m.add_argument("name")
    m.add_argument("--version", help="default: the current one")
    m.add_argument(
        "--min", type=int, dest="min_replicas", help="fewest replicas (default 1; 0: scale to zero)"
    )
    m.add_argument("--max", type=int, dest="max_replicas", help="most replicas (default 4)")
    m.add_argument(
        "--target", type=float, dest="target_utilization", help="utilisation to run at (0.7)"
    )
    m.add_argument("--up-window", type=float, dest="up_window_s", help="seconds (15)")
    m.add_argument("--down-window", type=float, dest="down_window_s", help="seconds (180)")
    m.add_argument("--interval", type=float, dest="interval_s", help="seconds per sample (1)")
    m.add_argument(
        "--scale-to-zero-after", type=float, dest="scale_to_zero_after_s",
        help="with --min 0: seconds without a query before the last replica goes (300)",
    )  # fmt: skip
    m.add_argument(
        "--max-held", type=int, dest="max_held_queries",
        help="inputs held while a version wakes from zero; beyond: the default at once (64)",
    )  # fmt: skip
    m.add_argument(
        "--shed-threshold", type=float, dest="shed_threshold", help="share shed or late (0.01)"
    )
    m.add_argument("--off", action="store_true", help="stop autoscaling (the settings stay)")
    m = model.add_parser(
        "set-version",
        parents=[common],
        help="switch traffic to a version (rollback = an older one)",
    )
    m.add_argument("name")
    m.add_argument("version")
    m = model.add_parser("delete", parents=[common], help="stop and delete a model version")
    m.add_argument("name")
    m.add_argument("version")
    m.add_argument(
        "--force",
        action="store_true",
        help="delete it even if it is the current version serving an application",
    )
    model.add_parser("list", parents=[common], help="list model versions")
    add_rollout_commands(model, common)

    link = sub.add_parser("link", parents=[common], help="link a model to an application")
    link.add_argument("app")
    link.add_argument("model")
    unlink = sub.add_parser("unlink", parents=[common], help="unlink a model from an application")
    unlink.add_argument("app")
    unlink.add_argument("model")
    add_operator_commands(sub, common, env)  # apply, export, logs, status, stop (cli_ops.py)
    add_tenant_commands(sub, common)  # tenants, quotas, API keys (tenant_commands.py)
    q = sub.add_parser("predict", parents=[common], help="send one query")
    q.add_argument("app")
    q.add_argument("input", help='the input as JSON, e.g. "[1.0, 2.0]"')
    q.add_argument("--version")
    q.add_argument("--uid", help="the user, for personalised selection")
    f = sub.add_parser("feedback", parents=[common], help="send a label for an input")
    f.add_argument("app")
    f.add_argument("input", help="the input as JSON")
    f.add_argument("label", help="the label as JSON")
    f.add_argument("--uid", help="the user, for personalised selection")


def _selection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=POLICIES.names, help=POLICIES.help())
    p.add_argument("--policy-params", help="JSON object, e.g. '{\"eta\": 0.1}'")
    p.add_argument("--min-confidence", type=float, help="below it, answer the default output")
    p.add_argument("--loss", choices=LOSSES.names, help=LOSSES.help())
    p.add_argument("--loss-scale", type=float)
    p.add_argument("--online-learning", choices=("on", "off"))


def _selection_args(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.policy is not None:
        out["policy"] = args.policy
    if args.policy_params is not None:
        params = orjson.loads(_json_text(args.policy_params, "--policy-params"))
        if not isinstance(params, dict):
            raise ConfigError("--policy-params must be a JSON object")
        out["policy_params"] = params
    for key in ("min_confidence", "loss", "loss_scale"):
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    if args.online_learning is not None:
        out["online_learning"] = args.online_learning == "on"
    return out


def run_command(args: argparse.Namespace) -> int:
    client = Client(args.admin_url, args.url, token=args.token) if "admin_url" in args else None
    try:
        if args.command in OPERATOR_COMMANDS:
            return run_operator_command(client, args)
        assert client is not None
        return _dispatch(client, args)
    except (RegistryError, RequestError) as e:
        _err(str(e))
        return EXIT_REFUSED
    except ConfigError as e:
        for line in str(e).splitlines():  # a bad file: each problem on its own line
            _err(line)
        return EXIT_USAGE
    except ClipperError as e:
        _err(str(e))
        return EXIT_UNREACHABLE


def _dispatch(client: Client, args: argparse.Namespace) -> int:
    cmd, action = args.command, getattr(args, "action", None)
    out: Any
    done = run_rollout_command(client, args)
    if done is None:
        done = run_tenant_command(client, args)
    if done is not None:
        return done
    if cmd == "app" and action == "register":
        _json_text(args.default_output, "--default-output")
        client.register_application(
            args.name, args.input_type, args.default_output, args.slo_micros,
            cache=not args.no_cache, overload=args.overload,
            on_model_error=args.on_model_error, **_selection_args(args),
            **({"require_key": True} if args.require_key else {}),
        )  # fmt: skip
        out = f"registered application {args.name}"
    elif cmd == "app" and action == "update":
        changes: dict[str, Any] = {}
        if args.slo_micros is not None:
            changes["latency_slo_micros"] = args.slo_micros
        if args.default_output is not None:
            changes["default_output"] = _json_text(args.default_output, "--default-output")
        if args.cache is not None:
            changes["cache"] = args.cache == "on"
        if args.require_key is not None:
            changes["require_key"] = args.require_key == "on"
        if args.overload is not None:
            changes["overload"] = args.overload
        if args.on_model_error is not None:
            changes["on_model_error"] = args.on_model_error
        changes.update(_selection_args(args))
        if not changes:
            _err(
                "nothing to update: give --slo-micros, --default-output, --cache, --require-key, "
                "--overload, "
                "--on-model-error or a selection option"
            )
            return EXIT_USAGE
        client.update_application(args.name, **changes)
        out = f"updated application {args.name}"
    elif cmd == "app" and action == "delete":
        client.delete_application(args.name)
        out = f"deleted application {args.name}"
    elif cmd == "app" and action == "list":
        apps = client.list_applications()
        return _show(
            args,
            apps,
            ["name", "input_type", "latency_slo_micros", "default_output", "linked_models"],
        )
    elif cmd == "app" and action == "pipeline":
        if args.remove:
            client.update_application(args.name, pipeline=None)
            out = f"application {args.name} has no pipeline"
        else:
            out = apply_description(client, args.name, args.file)
    elif cmd == "model" and action == "deploy":
        out = _deploy(client, args)
    elif cmd == "model" and action == "scale":
        _progress(
            f"scaling {args.name} to {args.replicas}",
            lambda: client.set_num_replicas(args.name, args.replicas, args.version),
            args,
        )
        out = f"{args.name} runs {args.replicas} replicas"
    elif cmd == "model" and action == "autoscale":
        settings = {k: getattr(args, k) for k in _AUTOSCALE if getattr(args, k) is not None}
        view = client.set_autoscale(args.name, args.version, enabled=not args.off, **settings)
        if args.json:
            print(orjson.dumps(view).decode())
            return EXIT_OK
        out = (
            f"{args.name}: autoscaling {'on' if view['enabled'] else 'off'}, "
            f"{view['min_replicas']} to {view['max_replicas']} replicas at "
            f"{view['target_utilization']:.0%} utilisation; {view['num_replicas']} now"
        )
        if view["min_replicas"] == 0 and view["enabled"]:
            out += (
                f" ({view.get('state', 'running')}; to zero after "
                f"{view['scale_to_zero_after_s']:g} s without a query)"
            )
    elif cmd == "model" and action == "set-version":
        _progress(
            f"switching {args.name} to version {args.version}",
            lambda: client.set_model_version(args.name, args.version),
            args,
        )
        out = f"{args.name} now serves version {args.version}"
    elif cmd == "model" and action == "delete":
        client.delete_model_version(args.name, args.version, force=args.force)
        out = f"deleted {args.name}:{args.version}"
    elif cmd == "model" and action == "list":
        return _show(
            args,
            client.list_models(),
            ["model_name", "model_version", "input_type", "is_current_version", "container_name"],
        )
    elif cmd == "link":
        client.link_model_to_app(args.app, args.model)
        out = f"linked {args.model} to {args.app}"
    elif cmd == "unlink":
        client.unlink_model_from_app(args.app, args.model)
        out = f"unlinked {args.model} from {args.app}"
    elif cmd == "predict":
        value = _json_text(args.input, "input")
        out = client.predict(args.app, orjson.loads(value), version=args.version, uid=args.uid)
        print(orjson.dumps(out).decode())
        return EXIT_OK
    elif cmd == "feedback":
        item = orjson.loads(_json_text(args.input, "input"))
        label = orjson.loads(_json_text(args.label, "label"))
        client.feedback(args.app, item, label, uid=args.uid)
        out = "feedback received"
    else:  # pragma: no cover - argparse requires a subcommand
        return EXIT_USAGE
    print(orjson.dumps({"ok": True, "message": out}).decode() if args.json else out)
    return EXIT_OK


_AUTOSCALE = (
    "min_replicas",
    "max_replicas",
    "target_utilization",
    "up_window_s",
    "down_window_s",
    "interval_s",
    "shed_threshold",
    "scale_to_zero_after_s",
    "max_held_queries",
)


def _deploy(client: Client, args: argparse.Namespace) -> str:
    path = Path(args.path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    batching = BatchingConfig(
        controller=args.controller, max_batch_size=args.max_batch_size,
        max_wait_micros=args.max_wait_micros, wait=args.wait,
    )  # fmt: skip
    if path.is_dir():
        kwargs: dict[str, Any] = {"artifact": path}
    else:  # what the file holds, from its content (imported here: numpy is slow to import)
        from clipper.deployers.files import read_model_file

        found = read_model_file(path)
        kwargs = {"model": found.model, "framework": args.framework or found.framework}
    # The file's digest: `clipper apply` of a file naming it then sees the same version.
    kwargs["source_sha256"] = content_digest(path)
    try:
        _progress(
            f"deploying {args.name}:{args.version} ({args.replicas} replicas)",
            lambda: client.deploy_model(
                args.name, args.version, input_type=args.input_type,
                num_replicas=args.replicas, batching=batching, input_size=args.input_size,
                pooled=args.pooled, labels=args.labels, **kwargs,
            ),
            args,
        )  # fmt: skip
    except (ClipperError, KeyboardInterrupt):
        raise
    except Exception as e:  # the framework's own failure while packaging: one line
        raise ConfigError(f"{path}: packaging the model failed: {type(e).__name__}: {e}") from e
    if args.pooled:
        return f"deployed {args.name}:{args.version}: pooled (loaded on demand), serving"
    replicas = f"{args.replicas} replica{'' if args.replicas == 1 else 's'}"
    return f"deployed {args.name}:{args.version}: {replicas} ready, serving"


def _progress(what: str, call: Callable[[], T], args: argparse.Namespace) -> T:
    """Run a long call, showing elapsed time on stderr (unless --json)."""
    if args.json or not sys.stderr.isatty():
        return call()
    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(0.5):
            print(f"\r{what} … {time.monotonic() - t0:4.1f}s", end="", file=sys.stderr, flush=True)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        return call()
    finally:
        done.set()
        ticker.join()
        print(f"\r{what} … {time.monotonic() - t0:4.1f}s", file=sys.stderr)


def _json_text(text: str, what: str) -> str:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ConfigError(f"{what} must be JSON text ({e}); quote strings: '\"text\"'") from None
    return text


def _show(args: argparse.Namespace, rows: Sequence[dict[str, Any]], cols: list[str]) -> int:
    if args.json:
        print(orjson.dumps(list(rows)).decode())
    else:
        print(table(rows, cols) if rows else "(none)")
    return EXIT_OK


def _err(msg: str) -> None:
    print(f"clipper: {msg}", file=sys.stderr)
