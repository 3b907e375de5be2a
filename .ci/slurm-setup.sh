#!/usr/bin/env bash
# The Slurm tests' packages: Debian's Slurm 22.05 (slurmctld, slurmd, slurmdbd, slurmrestd
# with JWT), munge and MariaDB for accounting. Installs only what is missing; the tests start
# private instances of each in a temporary directory (benchmarks/local_slurm.py), never the system's.
set -euo pipefail
need=()
command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
command -v slurmdbd >/dev/null || [ -x /usr/sbin/slurmdbd ] || need+=(slurmdbd)
command -v slurmrestd >/dev/null || [ -x /usr/sbin/slurmrestd ] || need+=(slurmrestd)
ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1 || need+=(slurm-wlm-jwt-plugin)
command -v munged >/dev/null || [ -x /usr/sbin/munged ] || need+=(munge)
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || need+=(mariadb-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The packages' own services are not used: the tests run private ones on their own ports.
for unit in slurmctld slurmd slurmdbd munge mariadb; do
  systemctl disable --now "$unit" >/dev/null 2>&1 || true
done
