"""Quality metrics against the synthetic face world's ground truth (`facecast eval`)."""
