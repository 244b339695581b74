"""The wiring: isthmus.yaml turned into the running parts. The one place that translates the
configuration into backend adapters (adapters.py) and into the pure policies' parameters
(runtime.py); the per-cycle views of jobs for the policies are broker/policy_inputs.py."""
