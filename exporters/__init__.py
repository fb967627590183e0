"""Model zoo, sub-model algebra, FLOPs counting and ONNX Runtime training artifacts."""
