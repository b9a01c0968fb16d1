// Package sharedtest is the conformance suite of what the Pools of
// several processes share through a store: a [pool.BackendLeases] (and
// [pool.HolderRegistry]), and a failover.Strategy shared by processes
// (with the optional interfaces a Pool uses, [Failover]). It is in
// the manner of go-cloud's drivertest and queue/queuetest:
// [pool.MemoryBackendLeases] runs the leases suite, and so do the adapter
// modules' stores (queue/pgqueue, queue/redisqueue), each in one test.
//
// Backend leases:
//
//	func TestBackendLeasesConformance(t *testing.T) {
//		sharedtest.RunBackendLeasesTests(t, sharedtest.LeasesHarness{
//			NewBacking: func(t *testing.T, now func() time.Time) func() pool.BackendLeases {
//				backing := newBacking(t) // a fresh schema, key prefix...
//				return func() pool.BackendLeases { return mystore.NewBackendLeases(backing, now) }
//			},
//		})
//	}
//
// The suite moves time itself: it gives NewBacking a clock (the store's
// test clock, for its lease expiries) and advances it; or, with
// [LeasesHarness].Synctest, for a store that uses the time package and no
// I/O, it runs every subtest in a testing/synctest bubble and passes nil.
// The Pool-level subtests (two Pools sharing backends through the store)
// pass nil too: they run on the store's own clock.
//
// A shared failover:
//
//	func TestFailoverConformance(t *testing.T) {
//		sharedtest.RunFailoverTests(t, func(t *testing.T) sharedtest.FailoverBacking {
//			backing := newBacking(t)
//			return sharedtest.FailoverBacking{
//				Open: func(t *testing.T, o sharedtest.FailoverOptions) sharedtest.Failover { ... },
//				BlockSilently: ..., ClearSilently: ..., // optional
//			}
//		})
//	}
//
// Its subtests stand for several processes by opening several failovers
// on one backing. They check that blocks and successes reach every
// process, that failures recorded at once are each counted, that a
// restart remembers the blocks, that blocks end everywhere, the order
// of Unblocked and events, that a late notification or a refresh that
// read before this process's own write does not undo it (holding the
// listener or the refresh in OnEvent meanwhile), that Close waits for
// the events under way and no event follows it, and, with Pools, that a
// Pool of another process skips a blocked pair and publishes the blocks
// it learns of. They run on real time and wait at most 10 s for a
// notification.
//
// It uses only the standard library and the core module, so that
// importing it pulls nothing into a store's module.
package sharedtest
