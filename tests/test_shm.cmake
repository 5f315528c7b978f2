# SPDX-License-Identifier: Apache-2.0
# test_shm forks target processes whose main thread checks memory that their
# serving thread filled with process_vm_readv; TSan suppresses each such
# (socket-ordered) report address by address, which takes minutes for the
# 64 MiB buffers. The threaded shm paths run under TSan in test_transfer
# (two engines in one process, shm chosen there too).
set_tests_properties(test_shm PROPERTIES LABELS no-tsan)
# Raw initiators that lie about their pid (fault.h's raw_hello_with).
target_link_libraries(test_shm PRIVATE ferry_fault_support)
