package files_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/comfypool/comfypool/files"
)

// A job's output goes into the store as it streams; its reference, stored
// in the job's record, opens it again from any process with the same store.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "files-example")
	defer os.RemoveAll(dir)

	disk, err := files.NewDiskStore(&files.DiskConfig{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	store, err := files.New(disk, &files.Config{Name: "outputs"})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	ref, err := store.Put(ctx, "jobs/42/ComfyUI_00001_.png", strings.NewReader("PNG bytes"), &files.PutOptions{ContentType: "image/png"})
	if err != nil {
		log.Fatal(err)
	}
	record, _ := json.Marshal(ref)
	fmt.Println(string(record))

	// Later, perhaps in another process: decode the record and open it.
	var back files.Ref
	_ = json.Unmarshal(record, &back)
	r, err := store.OpenRef(ctx, back)
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	body, err := io.ReadAll(r) // verified against the reference's size and digest
	fmt.Println(string(body), err, r.Attributes().ContentType)
	// Output:
	// {"store":"outputs","key":"jobs/42/ComfyUI_00001_.png","size":9,"content_type":"image/png","sha256":"9698103cd397cda6f9807a2e2bf51935727f47a62d9b6d4f82e54ef60c6ba831"}
	// PNG bytes <nil> image/png
}

// A pull worker gets a short-lived URL instead of credentials. The disk
// store's handler, mounted by the control plane, checks the signature,
// the method and the expiry.
func ExampleStore_SignedURL() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "files-example")
	defer os.RemoveAll(dir)

	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	srv := httptest.NewUnstartedServer(nil)
	disk, err := files.NewDiskStore(&files.DiskConfig{
		Dir:        dir,
		URL:        "http://" + srv.Listener.Addr().String() + "/files/",
		SigningKey: []byte("a secret of at least 32 bytes, random in real use"),
		Test:       files.DiskTestConfig{Now: func() time.Time { return now }},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/files/", disk.Handler())
	srv.Config.Handler = mux
	srv.Start()
	defer srv.Close()
	store, _ := files.New(disk, nil)

	// The worker uploads its output...
	put, _ := store.SignedURL(ctx, "jobs/42/out.txt", http.MethodPut, time.Minute)
	req, _ := http.NewRequest(http.MethodPut, put, strings.NewReader("made on a GPU"))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("PUT:", resp.Status)

	// ...and the control plane records a reference to it.
	ref, _ := store.Ref(ctx, "jobs/42/out.txt")
	fmt.Println(ref.Key, ref.Size, ref.ContentType)

	get, _ := store.SignedURL(ctx, "jobs/42/out.txt", http.MethodGet, time.Minute)
	now = now.Add(2 * time.Minute) // the URL has expired
	resp, err = http.Get(get)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Print("GET: ", resp.Status, ": ", string(body))
	// Output:
	// PUT: 200 OK
	// jobs/42/out.txt 13 text/plain
	// GET: 403 Forbidden: files: URL expired at 2026-11-23T12:01:00Z
}

// Identical outputs are stored once under the digest of their content.
func ExampleStore_PutContentAddressed() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "files-example")
	defer os.RemoveAll(dir)
	disk, _ := files.NewDiskStore(&files.DiskConfig{Dir: dir})
	store, _ := files.New(disk, nil)

	a, _ := store.PutContentAddressed(ctx, "outputs/", strings.NewReader("same image"), nil)
	b, _ := store.PutContentAddressed(ctx, "outputs/", strings.NewReader("same image"), nil)
	fmt.Println(a.Key)
	fmt.Println(a == b)
	// Output:
	// outputs/e0ded698dcebe5513cf283ec4a3e8930e094edf6756b9c596ec4d6a9f386ea0f
	// true
}
