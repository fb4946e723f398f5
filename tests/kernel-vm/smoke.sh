# Guest script of the standalone check (crates/cli/tests/integration/standalone.rs):
# the harness boots, and the image holds what the kernel-initiator tests rely
# on. Each check prints "PASS name" or "FAIL name"; the script fails if any does.
# Runs under plain sh (busybox), not -e: every check runs.
fails=0
check() {
  n=$1; shift
  if "$@" >/tmp/out 2>&1; then echo "PASS $n"; else echo "FAIL $n: $(tail -c 200 /tmp/out | tr '\n' ' ')"; fails=$((fails + 1)); fi
}
for m in nvme_tcp nvme_rdma iscsi_tcp aoe nvmet_tcp target_core_iblock configfs rdma_rxe nfsd; do
  check "modprobe $m" modprobe "$m"
done
check "configfs mounted" mount -t configfs none /sys/kernel/config
check "nvmet in configfs" test -d /sys/kernel/config/nvmet
check "LIO in configfs" test -d /sys/kernel/config/target
check "nvme-cli" nvme version
check "iscsiadm" iscsiadm --version
check "host reachable" ping -c 1 -W 5 10.0.2.2
echo "SMOKE-DONE fails=$fails"
[ "$fails" -eq 0 ]
