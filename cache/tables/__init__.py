"""The Store's tables, one module each (trials, winners, misses, meta, devices, and the pruning that
spans them), over one connection (`db.Db`); autotune.cache.store.Store joins them behind one façade."""
