"""Pruning: coupled channel groups found on fake tensors, cut by module surgery, checked and saved."""
