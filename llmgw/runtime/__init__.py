"""Controller runtime: informers, cache, work queues, the controller manager.

Modules: controller (the Controller interface), cache (shared informer cache),
informer (list + watch into the cache), workqueue, events (EventRecorder),
leader (leader election loop), manager (runs controllers), settings (the
manager's own, which the controllers' settings extend), metrics. It
knows no controller: llmgw/cmd/controller_manager.py hands them over.
"""
