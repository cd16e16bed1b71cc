<?php
/*
 * The hosted SAML 2.0 IdP: signs responses and assertions with the per-instance key in certdir,
 * authenticates with the `test-users` source, and sends a persistent NameID taken from
 * settings['nameid_attribute'] (saml:AttributeNameID runs before any attribute renaming).
 */

$settings = json_decode(
    file_get_contents(__DIR__ . '/../config/settings.json'), true, 512, JSON_THROW_ON_ERROR
);

$authproc = [
    10 => [
        'class' => 'saml:AttributeNameID',
        'attribute' => $settings['nameid_attribute'],
        'Format' => $settings['nameid_format'],
    ],
];
if ($settings['attribute_name_format'] === 'uri') {
    // uid -> urn:oid:0.9.2342.19200300.100.1.1, mail -> urn:oid:0.9.2342.19200300.100.1.3, ...
    $authproc[100] = ['class' => 'core:AttributeMap', 'name2oid'];
}

$metadata[$settings['idp_entity_id']] = [
    'host' => '__DEFAULT__',
    'privatekey' => 'idp.key',
    'certificate' => 'idp.crt',
    'auth' => 'test-users',

    'saml20.sign.response' => true,
    'saml20.sign.assertion' => true,
    'signature.algorithm' => 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',

    'NameIDFormat' => $settings['nameid_format'],
    'attributes.NameFormat' => $settings['attribute_name_format'] === 'uri'
        ? 'urn:oasis:names:tc:SAML:2.0:attrname-format:uri'
        : 'urn:oasis:names:tc:SAML:2.0:attrname-format:basic',
    'authproc' => $authproc,

    'SingleSignOnServiceBinding' => [
        'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect',
        'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST',
    ],
];
