"""interp.store: stream activations to a sharded, resumable store on disk, read them back, train sae-lens
SAEs and transcoders from them, and scale the harvest out with Ray.

::

    from interp.store import harvest, ActivationStore
    res = harvest("zoo:smollm2-135m", "corpus.txt", "blocks.*.hook_resid_post", "acts/", context_size=128)
    store = ActivationStore("acts/")
    for batch in store.batches(4096, seed=0, names="blocks.3.hook_resid_post"):
        ...

See ``docs/scale.md``.
"""
from .harvest import DTYPES, ENGINES, HARVEST_ENGINES, HarvestConfig, HarvestResult, compute_shard, harvest, stop_layer, weights_fingerprint
from .manifest import CorruptShardError, IncompatibleStoreError, StoreError, StoreWriteError
from .packing import Context, pack, special_token_id, tokenized
from .reader import ActivationStore, StoreColumn, StoreDataset
from .sources import DataSource, open_source

__all__ = ["harvest", "HarvestConfig", "HarvestResult", "ActivationStore", "StoreColumn", "StoreDataset",
           "StoreError", "StoreWriteError", "IncompatibleStoreError", "CorruptShardError", "DataSource", "open_source", "Context",
           "pack", "tokenized", "special_token_id", "compute_shard", "stop_layer", "weights_fingerprint", "DTYPES", "ENGINES", "HARVEST_ENGINES",
           "SAETrainConfig", "SAETrainingResult", "train_sae", "train_transcoder"]


def __getattr__(name: str):
    # sae-lens is imported only when its interop is used (it pulls in wandb and more)
    if name in ("SAETrainConfig", "SAETrainingResult", "train_sae", "train_transcoder"):
        from . import sae
        return getattr(sae, name)
    raise AttributeError(f"module 'interp.store' has no attribute {name!r}")
