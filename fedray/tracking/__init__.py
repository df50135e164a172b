"""Following and comparing runs: callbacks, the progress line, TensorBoard, MLflow,
reports."""
