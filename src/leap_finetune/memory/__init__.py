"""GPU memory: the model's shape from its config (shapes.py), the predicted peak of each process in parts
(estimate.py, plan.py), the constants fitted to measured peaks (calibration.py)."""
