"""The Open Inference Protocol's gRPC messages, generated from ``inference.proto`` beside this file.

``inference_pb2.py`` and ``inference_pb2.pyi`` are protoc's output, committed so that the agent
needs only ``grpcio`` and ``protobuf`` at run time; ``inference.proto`` says how to regenerate them.
"""
