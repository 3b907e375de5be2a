"""Trace simulator: replays a GPU workload trace through the engine and baselines.

``python -m scheduler.simulate --trace ../shared/traces/alibaba2023_openb_gpu.csv \\
    --gpus 32 --gpus-per-node 8 --policy labportal --users 30 --seed 1 --load 1.0 --json``

How the trace becomes jobs (see docs/scheduler.md for the reasoning):

* Pods that never started (no duration) are dropped; ``--window auto`` (the default)
  skips a sparse head (at most 1% of the jobs), ``dense`` keeps the last 34.5 days
  (submit >= 9.9e6 s), where the arrivals are, and ``all`` keeps everything.
* Users: a seeded Zipf draw (s = 1.1) over ``--users`` users; user rank r is in
  category ``staff`` (r % 5 == 0), ``phd`` (r % 5 in 1..2) or ``master``.
* Time limits: users overestimate. Each job's run time is multiplied by a seeded
  factor 1.2 + Exp(mean 1.3) and rounded up to the next standard limit
  (10 min, 30 min, 1 h, 2 h, 4 h, 8 h, 12 h, 24 h, 48 h, 72 h, 7 d; beyond, whole days).
* Queues: a 1-GPU pod asking for a GPU fraction below 1 whose limit is at most 1 h
  goes to ``debug`` on one shared slot; everything else goes to ``normal`` (fractional
  pods with longer limits run on a whole GPU there, and the result counts them:
  ``fractional_as_whole``). BE
  (best-effort) pods are marked preemptible.
* ``--load`` divides the inter-arrival times: 2.0 offers twice the work per hour.
* Runtime features: the image stands for the pod's QoS class and GPU fraction (the
  pod spec), the command for the GPU count; the trace has nothing finer.
"""

# The modules, each on one concern (``python -m scheduler.simulate`` runs ``cli``):
#   workload  the trace read into jobs with users, limits and queues (SimJob, Workload)
#   run       the replay: cluster, policies, the event loop (Simulation, simulate)
#   backlog   what the incremental replay keeps between events (_Backlog, _FreeUnits)
#   peers     the published peer policies and their replay (PeerReplay, PEERS)
#   metrics   what a replay reports: waits, fairness, estimate errors
#   cli       the command line: the table or one JSON object per policy
