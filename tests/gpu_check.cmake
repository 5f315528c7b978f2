# SPDX-License-Identifier: Apache-2.0
# scripts/gpu-check.sh, the check for a GPU machine, in the mode it takes
# without one: it says why it skipped and exits 0 (nvidia-smi named as a
# file that does not exist, so that the test means the same on any machine).
add_test(NAME gpu_check_skips
         COMMAND sh -c "out=$(NVIDIA_SMI=/nonexistent/nvidia-smi ${CMAKE_SOURCE_DIR}/scripts/gpu-check.sh) || exit 1; echo \"$out\"; echo \"$out\" | grep -q 'gpu-check: SKIPPED: no NVIDIA driver'")
set_tests_properties(gpu_check_skips PROPERTIES LABELS no-tsan TIMEOUT 30)
