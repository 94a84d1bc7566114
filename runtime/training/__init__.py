"""What a training run leaves: checkpoints and their formats, metric sources, divergence and early stopping, kept good copies, training configs."""
