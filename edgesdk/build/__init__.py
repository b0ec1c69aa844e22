"""The host build pipeline: model source -> registered stages -> ONNX export -> bundle."""
