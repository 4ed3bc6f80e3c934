"""The Open Inference Protocol (KServe V2) over gRPC: :class:`V2GrpcServer`.

``inference.proto`` defines the service; ``inference_pb2*.py`` are generated from it by
``python -m clipper.frontend.grpc.generate`` and committed.
"""
