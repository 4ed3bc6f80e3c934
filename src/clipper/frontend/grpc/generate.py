"""Regenerate ``inference_pb2.py``, ``inference_pb2.pyi`` and ``inference_pb2_grpc.py`` from
``inference.proto`` (needs ``grpcio-tools``, in the ``test`` extra)::

    python -m clipper.frontend.grpc.generate

The generated modules are committed, so serving needs only ``grpcio`` and ``protobuf``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "clipper.frontend.grpc"


def main() -> int:
    from grpc_tools import protoc

    include = Path(protoc.__file__).resolve().parent / "_proto"
    rc: int = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{HERE}",
            f"-I{include}",
            f"--python_out={HERE}",
            f"--pyi_out={HERE}",
            f"--grpc_python_out={HERE}",
            str(HERE / "inference.proto"),
        ]
    )
    if rc != 0:
        return rc
    _private_pool(HERE / "inference_pb2.py")
    # protoc writes ``import inference_pb2``, a top-level import; make it package-relative.
    stub = HERE / "inference_pb2_grpc.py"
    text = stub.read_text()
    text = re.sub(
        r"^import inference_pb2 as", f"from {PACKAGE} import inference_pb2 as", text, flags=re.M
    )
    stub.write_text(text)
    return 0


def _private_pool(path: Path) -> None:
    """Build the descriptors in a pool of their own, not protobuf's default pool.

    Every implementation of the protocol defines the same ``inference.*`` messages; two of
    them (ours and, say, ``tritonclient.grpc``'s) in one default pool fail with "duplicate
    symbol". A private pool lets a process serve with ours and call with a client's. The
    wire format depends only on field numbers and the method paths, not on the pool.
    """
    text = path.read_text()
    default = "_descriptor_pool.Default().AddSerializedFile("
    if default not in text:
        raise SystemExit(f"{path.name}: protoc's output changed; {default!r} not found")
    text = text.replace(
        default,
        "_POOL.AddSerializedFile(",
    ).replace(
        "_sym_db = _symbol_database.Default()",
        "_sym_db = _symbol_database.Default()\n"
        "# A pool of its own: see clipper.frontend.grpc.generate._private_pool.\n"
        "_POOL = _descriptor_pool.DescriptorPool()",
    )
    text = text.replace("'inference_pb2', _globals)", f"'{PACKAGE}.inference_pb2', _globals)")
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
