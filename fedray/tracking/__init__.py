"""Following and comparing runs: callbacks, the progress line, TensorBoard, MLflow, Weights &
Biases (their shared tags: tags.py), reports."""
