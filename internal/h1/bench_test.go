package h1

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// benchHeader is the header of a delivery as the http handler sends it.
func benchHeader(b []byte) []byte {
	return append(b, "User-Agent: streamd\r\nContent-Type: application/octet-stream\r\n"+
		"Streamd-Subscription: bench\r\nStreamd-Stream-Key: orders\r\nStreamd-Seq: 12345\r\n"+
		"Streamd-Shard: 0\r\nStreamd-Timestamp-Ms: 1700000000000\r\nStreamd-Attempt: 1\r\n"...)
}

// BenchmarkPost posts 100-byte bodies from 32 goroutines to a local
// server, through a Client and, for comparison, through net/http's
// Transport with the same header; ns/op and allocs/op are per request,
// client and server together (both run in this process).
func BenchmarkPost(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	body := bytes.Repeat([]byte("x"), 100)
	b.Run("client=h1", func(b *testing.B) {
		c := newClient(b, Options{}, srv.URL)
		req := &Request{AppendHeader: benchHeader, Body: body}
		b.SetParallelism(16) // 32 goroutines on 2 cores
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.Post(b.Context(), testTimeout, req)
				if err != nil {
					b.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	})
	b.Run("client=net-http", func(b *testing.B) {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 128
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		b.SetParallelism(16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequestWithContext(b.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
				req.Header = http.Header{
					"User-Agent": {"streamd"}, "Content-Type": {"application/octet-stream"},
					"Streamd-Subscription": {"bench"}, "Streamd-Stream-Key": {"orders"}, "Streamd-Seq": {"12345"},
					"Streamd-Shard": {"0"}, "Streamd-Timestamp-Ms": {"1700000000000"}, "Streamd-Attempt": {"1"},
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	})
}
