"""The Headrace Kubernetes operator (kopf).

Pure parts: :mod:`.models` (the CRD models), :mod:`.crdgen`, :mod:`.builders`,
:mod:`.nodeplan`, :mod:`.status`, :mod:`.events` (event objects). I/O edges:
:mod:`.kube` (the Kubernetes API), :mod:`.coordinator_runner` (the metastore and
the in-process coordinators), :mod:`.probe` (backend reachability). The
reconcile passes are :mod:`.steps`; :mod:`.handlers` wires them to kopf and
:mod:`.main` starts the operator.
"""
