// Package s3store is the [files.Driver] for S3-compatible object stores
// (AWS S3, MinIO, versitygw, Ceph RGW, Cloudflare R2, ...), in a module of
// its own so that the core module does not depend on an S3 client.
//
//	d, err := s3store.New(&s3store.Config{
//		Endpoint:        "https://s3.eu-west-1.amazonaws.com",
//		Region:          "eu-west-1",
//		Bucket:          "renders",
//		Prefix:          "comfypool/",
//		AccessKeyID:     id,
//		SecretAccessKey: secret,
//	})
//	store, err := files.New(d, &files.Config{Name: "outputs"})
//
// Pull workers get S3 pre-signed GET and PUT URLs from [files.Store.SignedURL]
// (short-lived, made locally, checked by the server), never the
// credentials.
//
// # Memory
//
// Bodies stream. A body of known size up to [Config].PartSize goes in one
// request, unbuffered; a larger body, or one of unknown size, goes as a
// multipart upload that holds one part (PartSize bytes, 16 MiB by default)
// in memory at a time, so a Put needs at most PartSize bytes of buffer
// whatever the body's length. Reads stream the response body.
//
// # Client
//
// The driver uses github.com/minio/minio-go/v7 (v7.1.0: the newest release
// whose go.mod allows Go 1.25; later ones require Go 1.26 or pull a linter's
// module graph into ours), a single module with a handful of small
// dependencies, with its request retries turned off. No minio-go type
// appears in this package's API, so the client can be replaced.
//
// # Tests
//
// The tests run the files conformance suite against versitygw, a real
// S3-compatible server started as a separate process with its posix backend
// in a temporary directory on a loopback port. They find it through
// $VERSITYGW or PATH; without it they fail when CI=true and are skipped
// otherwise. Install it with
//
//	go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
package s3store
