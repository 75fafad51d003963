package envelope_test

import (
	"fmt"

	"github.com/streamd/streamd/envelope"
)

func ExampleEncode() {
	var h envelope.Headers
	h.SetRetryCount(1)
	fmt.Printf("%s\n", envelope.Encode(h, []byte(`{"id":7}`), false))
	fmt.Printf("%s\n", envelope.Encode(nil, []byte(`{"id":7}`), false))
	// Output:
	// rs1:AAAAHHgtcnVzdHN0cmVhbS1yZXRyeS1jb3VudDogMQp7ImlkIjo3fQ==
	// {"id":7}
}

func ExampleDecode() {
	h, payload := envelope.Decode([]byte("rs1:AAAAHHgtcnVzdHN0cmVhbS1yZXRyeS1jb3VudDogMQp7ImlkIjo3fQ=="))
	for _, e := range h {
		fmt.Printf("%s = %s\n", e.Name, e.Value)
	}
	fmt.Printf("payload %s\n", payload)
	fmt.Println("attempt", envelope.RetryCount(h)+1)
	// Output:
	// x-ruststream-retry-count = 1
	// payload {"id":7}
	// attempt 2
}

func ExampleNextAttemptHeaders() {
	delivery := envelope.Headers{}
	delivery.Set("X-Tenant", []byte("acme"))
	delivery.SetSequence(41)
	delivery.SetRetryCount(4)
	for _, e := range envelope.NextAttemptHeaders(delivery) {
		fmt.Printf("%s = %s\n", e.Name, e.Value)
	}
	// Output:
	// x-tenant = acme
	// stream-sequence = 41
	// x-ruststream-retry-count = 5
}
