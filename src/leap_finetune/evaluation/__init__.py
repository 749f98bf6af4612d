"""Benchmarks: generation and log-prob multiple choice, during training and standalone."""
