"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`) and the standard health service."""
