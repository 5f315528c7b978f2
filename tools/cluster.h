/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster`: one engine of a many-engine cluster (cmd_cluster.c) and
 * the report over the logs the engines wrote (cmd_cluster_report.c).
 * scripts/cluster.sh builds the namespaces, links and etcd, starts one
 * `ferry cluster node` per namespace, writes DIR/go ("START_MS END_MS")
 * once every engine is up (the decodes ask from then until END_MS), injects
 * the faults (DIR/faults: "T_MS KIND TARGET start|end") and runs
 * `ferry cluster report`.
 *
 * Logs: DIR/node-INDEX.log, one line per event, appended by every
 * incarnation of the node (times are wall-clock milliseconds, comparable
 * between processes and with the script's `date +%s%3N`):
 *   prefill  R END_MS LAT_US DECODE BYTES CODE STALE  one KV send (STALE 1:
 *                                                   refused before sending,
 *                                                   it came from a dead
 *                                                   incarnation of DECODE)
 *   decode   V T_MS PREFILL BYTES BAD_BYTES        a request verified
 *            F T_MS PREFILL CODE QUARANTINED       the sender's failure notice
 *            N T_MS PREFILL CODE                   asking PREFILL failed
 *            A T_MS PREFILL                        no notice by the abandon limit
 *            X T_MS STALE_BYTES                    bytes found in free pages
 *            E T_MS VERIFIED BAD STALE QUARANTINED_PAGES ABANDONED
 *   probe    P T_MS PEER CODE LAT_US               a new session opened
 *   all      S T_MS THREADS RSS_KB PEERS OWN SESSIONS CONNS_OUT CONNS_IN
 *                                                   once a second; PEERS: peers with metrics;
 *                                                   OWN: the node's threads, not the engine's;
 *                                                   SESSIONS: peers with a connection up;
 *                                                   CONNS: established TCP, to peers / into it
 *            B T_MS INCARNATION                    started */
#ifndef FERRY_CLUSTER_H
#define FERRY_CLUSTER_H

int cluster_report_main(int argc, char **argv);

#endif
