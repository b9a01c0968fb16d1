// Package storetest is the conformance suite every [dag.Store] runs, in
// the manner of go-cloud's drivertest and queue/queuetest: the stores that
// ship ([dag.MemoryStore], [dag.FileStore]) run it, and so should a
// database-backed Store written later.
//
// A Store wires it up in one test:
//
//	func TestStoreConformance(t *testing.T) {
//		storetest.RunStoreTests(t, func(t *testing.T) dag.Store {
//			return mystore.New(t.TempDir()) // a new, empty store
//		})
//	}
//
// The suite checks the Store contract documented on [dag.Store]: creation
// is exclusive, updates and node saves need an existing execution, node
// records are created or replaced, Load returns copies, Delete removes
// everything and tolerates missing executions, memo values are replaced,
// concurrent saves are all kept, a [dag.BatchStore]'s SaveNodes saves as
// SaveNode would, in order, times and raw JSON survive a round trip
// (times compared with time.Time.Equal, JSON semantically, so a store may
// re-encode both), and what the contract's checks reject
// ([dag.CheckExecutionRecord] and the others) is rejected with an error
// matching [dag.ErrInvalid], leaving nothing written.
//
// A [dag.LeaseStore] also runs [RunLeaseTests], giving the suite a fake
// clock for its leases ([Clock]):
//
//	func TestStoreLeases(t *testing.T) {
//		storetest.RunLeaseTests(t, func(t *testing.T) storetest.LeaseFixture {
//			clock := storetest.NewClock(time.Now())
//			return storetest.LeaseFixture{Store: mystore.New(clock.Now), Advance: clock.Advance}
//		})
//	}
//
// It uses only the standard library, so that importing it pulls nothing
// into a store's module.
package storetest
