"""The control plane: leadership, admission cycle, dispatcher and reconcilers."""
