"""Faults injected into every Ray worker of a test's cluster (``worker_process_setup_hook``): each replaces one
method of the system's own classes, in the worker process, before any actor is built."""


def engines_keep_old_weights() -> None:
    """Every producer takes each new version's number without loading its weights: the engines go on
    generating with the weights they started with, and label the rows with the new version."""
    from coati.rollout.producer import Producer

    def sync_without_loading(self, min_version, timeout_s=600.0):
        self.version = self.weights.load_newest(lambda named_tensors: None, self.version, min_version, timeout_s)

    Producer._sync_weights = sync_without_loading
