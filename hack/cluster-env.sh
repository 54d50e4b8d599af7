# Sourced by the cluster scripts: where a local cluster lives and which binaries it runs.
# MPIJOB_ELASTIC_CLUSTER names the cluster, so a second one (a parallel test run) can sit
# beside the first; kwokctl picks free ports for every component.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster_name=${MPIJOB_ELASTIC_CLUSTER:-mpijob-elastic}
cache_root=${MPIJOB_ELASTIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpijob-elastic}
export KWOK_WORKDIR="$cache_root/kwok"
kubeconfig="$KWOK_WORKDIR/clusters/$cluster_name/kubeconfig.yaml"
