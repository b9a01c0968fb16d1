package files

import "time"

// Ref is a reference to a stored object: plain data, meant to live in a
// shared record (a job's result in the queue) and to be opened by any
// process that has a [Store] of the same name configured, with
// [Store.OpenRef]. It marshals to snake_case JSON:
//
//	{"store":"outputs","key":"jobs/42/image.png","size":51234,"content_type":"image/png","sha256":"9f86d0…"}
type Ref struct {
	// Store is the [Config].Name of the store that holds the object.
	Store string `json:"store"`
	// Key names the object in that store.
	Key string `json:"key"`
	// Size is the object's length in bytes.
	Size int64 `json:"size"`
	// ContentType is the object's media type; empty when none was given.
	ContentType string `json:"content_type,omitempty"`
	// SHA256 is the lower-case hex SHA-256 of the content; empty when
	// unknown (a reference built by [Store.Ref] for an object the store did
	// not record a digest for). OpenRef verifies it while reading.
	SHA256 string `json:"sha256,omitempty"`
}

// Attributes describe a stored object.
type Attributes struct {
	// Size is the object's length in bytes.
	Size int64 `json:"size"`
	// ContentType is the media type stored with the object; empty when
	// none was given.
	ContentType string `json:"content_type,omitempty"`
	// ModTime is when the object was last written.
	ModTime time.Time `json:"mod_time"`
	// SHA256 is the lower-case hex SHA-256 of the content when the store
	// recorded it: [DiskStore] always does; other drivers may not (see
	// their documentation). Empty when unknown.
	SHA256 string `json:"sha256,omitempty"`
}
