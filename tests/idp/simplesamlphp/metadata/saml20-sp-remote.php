<?php
/*
 * The service providers this IdP answers, from settings['sps'] (the portal's SP: entity id, ACS URL
 * and optionally its SLO URL and certificate). Unsigned AuthnRequests are accepted unless an SP
 * entry sets 'validate_authnrequest'.
 */

$settings = json_decode(
    file_get_contents(__DIR__ . '/../config/settings.json'), true, 512, JSON_THROW_ON_ERROR
);

foreach ($settings['sps'] as $sp) {
    $entry = [
        'AssertionConsumerService' => [
            [
                'Binding' => 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST',
                'Location' => $sp['acs_url'],
                'index' => 0,
                'isDefault' => true,
            ],
        ],
        'NameIDFormat' => $settings['nameid_format'],
        'saml20.sign.response' => true,
        'saml20.sign.assertion' => true,
        'validate.authnrequest' => !empty($sp['validate_authnrequest']),
        'validate.logout' => false,
    ];
    if (!empty($sp['slo_url'])) {
        $entry['SingleLogoutService'] = [
            [
                'Binding' => 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect',
                'Location' => $sp['slo_url'],
            ],
        ];
    }
    if (!empty($sp['cert_pem'])) {
        $entry['certData'] = preg_replace('/-----[A-Z ]+-----|\s+/', '', $sp['cert_pem']);
    }
    $metadata[$sp['entity_id']] = $entry;
}
