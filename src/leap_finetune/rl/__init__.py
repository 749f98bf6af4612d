"""Rewards and judges for RL training."""
