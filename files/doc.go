// Package files is comfypool's file store: the one interface through which
// a job's inputs and outputs stream, never whole in memory, so that a result
// outlives the backend that made it and any process on the same queue can
// open it.
//
// API is not stable before v1.
//
// # Shape
//
// [Store] is a concrete, portable type over a small [Driver] interface, as
// go-cloud's blob.Bucket is over its driver.Bucket (and as queue.Queue is
// over queue.Driver). A small interface implemented by every backend would
// read shorter, but then every backend would have to re-implement, and could
// get wrong, the rules that matter most: which keys are valid (no path
// traversal), that a body shorter or longer than declared, with the wrong
// digest, or cut off by a cancelled context is never stored, that the
// SHA-256 is computed while streaming, what a reference holds, and how
// errors wrap. The Store keeps those once; a driver only moves bytes, and
// the conformance suite [github.com/comfypool/comfypool/files/filestest]
// checks that it does so atomically. New operations can be added to the
// Store later without breaking drivers.
//
// Two drivers exist: [DiskStore] here (standard library only), and an
// S3-compatible one in its own module, github.com/comfypool/comfypool/files/s3store.
//
//	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: "/var/lib/comfypool/files"})
//	store, err := files.New(disk, &files.Config{Name: "outputs"})
//	ref, err := store.Put(ctx, "jobs/42/out.png", body, &files.PutOptions{ContentType: "image/png"})
//	...
//	r, err := store.OpenRef(ctx, ref) // in any process with a store named "outputs"
//	defer r.Close()
//
// # References
//
// [Ref] is plain, JSON-serialisable data (store name, key, size, content
// type, SHA-256) meant for a shared record such as a job's result in the
// queue. [Store.OpenRef] opens it and verifies size and digest while
// reading, so a reference never silently yields other content.
// [Store.PutContentAddressed] names an object by the digest of its content,
// so identical outputs are stored once.
//
// # Signed URLs
//
// [Store.SignedURL] returns a short-lived GET or PUT URL for one key, for
// workers that must move files without holding credentials. A DiskStore
// signs with HMAC-SHA256 over method, key and expiry and serves the URLs
// with [DiskStore.Handler] (the control plane mounts it); the S3 store
// returns S3 pre-signed URLs. Expired, altered or wrong-method requests are
// refused with 403.
//
// # Errors
//
// Conditions to branch on are sentinels tested with errors.Is:
// [ErrNotFound], [ErrInvalidKey] (a [*KeyError] says which rule the key
// breaks), [ErrSizeMismatch], [ErrDigestMismatch], [ErrStoreMismatch] and
// [ErrInvalid] (other bad arguments). A driver that cannot sign URLs returns
// an error matching errors.ErrUnsupported. A failed or cancelled Put reports
// the body's failure (context.Canceled, the reader's error) as its cause.
package files
